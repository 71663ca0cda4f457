"""The numbers of `et_def.proto` the conversion needs, as plain ints: node types, collective types and the field
numbers `etweave.nodes` encodes by hand.

A conversion imports this, not `et_def_pb2`: loading protobuf's runtime and building the schema's descriptors
costs about 30 ms, a tenth of converting a 20 MB trace, and a conversion whose nodes are all compute nodes never
needs a protobuf object. `tests/unit/test_schema.py` checks every value here against `et_def_pb2`.
"""

from __future__ import annotations

# enum NodeType
NODE_TYPE_NAMES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE",
                   "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")
(INVALID_NODE, METADATA_NODE, MEM_LOAD_NODE, MEM_STORE_NODE, COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE,
 COMM_COLL_NODE) = range(len(NODE_TYPE_NAMES))

# enum CollectiveCommType
COLLECTIVE_NAMES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL",
                    "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
(ALL_REDUCE, REDUCE, ALL_GATHER, GATHER, SCATTER, BROADCAST, ALL_TO_ALL, REDUCE_SCATTER, REDUCE_SCATTER_BLOCK,
 BARRIER) = range(len(COLLECTIVE_NAMES))

# Field numbers, by message.
GLOBAL_METADATA_FIELDS = {"version": 1, "attr": 2}
NODE_FIELDS = {"id": 1, "name": 2, "type": 3, "ctrl_deps": 4, "data_deps": 5, "start_time_micros": 6,
               "duration_micros": 7, "inputs": 8, "outputs": 9, "attr": 10}
IO_INFO_FIELDS = {"values": 1, "shapes": 2, "types": 3}
# AttributeProto: name, doc_string, then the `value` oneof: each scalar type's `_val` then its `_list`.
_VALUE_TYPES = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
                "sfixed32", "sfixed64", "bool", "string", "bytes")
ATTRIBUTE_FIELDS = {"name": 1, "doc_string": 2,
                    **{f"{t}_{form}": 3 + 2 * i + j for i, t in enumerate(_VALUE_TYPES)
                       for j, form in enumerate(("val", "list"))}}
LIST_VALUES_FIELD = 1  # `values` of every *List message


def node_type_name(value: int) -> str:
    """The name of a NodeType value held as a plain int ("COMP_NODE"); ValueError for an unknown value (as
    protobuf's `NodeType.Name`)."""
    if not 0 <= value < len(NODE_TYPE_NAMES):
        raise ValueError(f"{value} is not a NodeType")
    return NODE_TYPE_NAMES[value]
