"""What the simulator accepts: the one home of the node types, collective types, attr types and group ids that
ASTRA-sim and its feeder take (docs/FACTS.md §E, and §A where it contradicts §E). `etweave.check` checks files
against these; the converter (`etweave.collectives`) writes by them; the replay and cross-rank code tell comm nodes
by `COMM_NODE_TYPES`."""

from __future__ import annotations

from etweave.chakra import schema

# Nodes that communicate: the replay synchronises them across ranks, ASTRA-sim's `issue_comm` takes them.
COMM_NODE_TYPES: frozenset[int] = frozenset({schema.COMM_SEND_NODE, schema.COMM_RECV_NODE, schema.COMM_COLL_NODE})
MEM_NODE_TYPES: frozenset[int] = frozenset({schema.MEM_LOAD_NODE, schema.MEM_STORE_NODE})
# Types ASTRA-sim issues (3b.1: METADATA_NODE aborts it; INVALID_NODE is skipped, so its work would be lost).
VALID_NODE_TYPES: frozenset[int] = frozenset({schema.COMP_NODE, *MEM_NODE_TYPES, *COMM_NODE_TYPES})

# Collectives the network model times from comm_size alone (3b.4); BROADCAST replays duration_micros.
SIZE_TIMED_COLLECTIVES: frozenset[int] = frozenset(
    {schema.ALL_REDUCE, schema.ALL_GATHER, schema.REDUCE_SCATTER, schema.ALL_TO_ALL})
# Collectives the simulator runs; every other type makes it throw `Unsupported collective comm type` (3b.4).
SUPPORTED_COLLECTIVES: frozenset[int] = frozenset(
    {*SIZE_TIMED_COLLECTIVES, schema.BROADCAST})
# What etweave writes instead of each collective the simulator throws on: the converter maps by it and `check`
# names it, so the two never disagree.
SIMULATOR_MAPPING: dict[int, int] = {
    schema.BARRIER: schema.ALL_REDUCE,  # a barrier behaves like a tiny all-reduce: everyone waits for everyone
    schema.REDUCE: schema.ALL_REDUCE,  # same traffic to the root, plus the result fanned back out
    schema.GATHER: schema.ALL_GATHER,  # same per-rank input; every rank receives instead of only the root
    schema.SCATTER: schema.BROADCAST,  # one root fans out; BROADCAST replays the measured duration: time stays true
    schema.REDUCE_SCATTER_BLOCK: schema.REDUCE_SCATTER,  # same operation with equal blocks
}

# The oneof each attr must use: a value in another one reads as 0 (section 3 item 3). The attrs the simulator
# reads, plus those docs/OUTPUT.md documents for etweave's own output, so a converter that drifts from its own
# documentation is caught too.
SIMULATOR_ATTR_TYPES: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "num_ops": "int64_val",
    "pg_name": "string_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "involved_dim": "bool_list",
    "tensor_size": "uint64_val",
    "pg_config": "string_val",
}
ATTR_TYPES: dict[str, str] = {
    **SIMULATOR_ATTR_TYPES,
    # etweave's replay resources (OUTPUT.md)
    "tid": "int64_val",
    "device": "int64_val",
    "stream": "int64_val",
    # etweave's provenance attrs (OUTPUT.md)
    "kind": "string_val",
    "et_tid": "int64_val",
    "et_parent": "int64_val",
    "orphan_parent": "int64_val",
    "linked": "bool_val",
    "rf_id": "int64_val",
    "seq_id": "int64_val",
    "collective_name": "string_val",
    "comm_seq": "int64_val",
}
# With roofline on, every COMP_NODE needs both; there is no default (3b.3).
ROOFLINE_ATTRS = ("num_ops", "tensor_size")
# What a comm node needs to be issued and matched (section 3 items 3 and 5).
COLLECTIVE_ATTRS = ("comm_type", "comm_size")
P2P_ATTRS = ("comm_src", "comm_dst", "comm_tag", "comm_size")


def is_group_id(name: str) -> bool:
    """A comm-group id ASTRA-sim accepts: ASCII decimal digits, value >= 1 (CommunicatorGroup asserts id > 0,
    3b.5). The group of all ranks is pg_name "" and has no id."""
    return name.isascii() and name.isdecimal() and int(name) >= 1


def comm_type_name(value: int) -> str:
    """CollectiveCommType name of `value`, or the number when it names none (a message about bad input)."""
    names = schema.COLLECTIVE_NAMES
    return names[value] if 0 <= value < len(names) else str(value)
