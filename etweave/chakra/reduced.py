"""Chakra's Node message with some of its fields only: the same wire format, parsed by protobuf (upb, in C), so a
reader that needs a few fields of every node builds no object for the others (an absent field's bytes are kept as
unknown fields, never decoded).

`node_class` builds one from field names of `et_def.proto`'s Node (`etweave.chakra.schema.NODE_FIELDS`), each
with its wire type as Chakra's (`attr`, a repeated message there, may be read as repeated bytes: one entry's
serialized AttributeProto each).
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.schema import NODE_FIELDS

_FD = descriptor_pb2.FieldDescriptorProto
# Chakra's type of each Node field; `type` is an open enum, which reads as int32
_TYPES = {"id": _FD.TYPE_UINT64, "name": _FD.TYPE_STRING, "type": _FD.TYPE_INT32, "ctrl_deps": _FD.TYPE_UINT64,
          "data_deps": _FD.TYPE_UINT64, "start_time_micros": _FD.TYPE_UINT64, "duration_micros": _FD.TYPE_UINT64,
          "inputs": _FD.TYPE_MESSAGE, "outputs": _FD.TYPE_MESSAGE, "attr": _FD.TYPE_MESSAGE}
_REPEATED = frozenset({"ctrl_deps", "data_deps", "attr"})
_MESSAGE_TYPES = {"inputs": ".ChakraProtoMsg.IOInfo", "outputs": ".ChakraProtoMsg.IOInfo",
                  "attr": ".ChakraProtoMsg.AttributeProto"}


def node_class(name: str, fields: tuple[str, ...], as_bytes: frozenset[str] = frozenset()) -> type[Message]:
    """A message class `etweave_reduced.<name>` with these Node fields; those in `as_bytes` (a string or message
    field) read as bytes: a name decoded once per distinct value, an attr entry decoded only when wanted."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb))
    f = descriptor_pb2.FileDescriptorProto(name=f"etweave_reduced_{name}.proto", package="etweave_reduced",
                                           syntax="proto3", dependency=[pb.DESCRIPTOR.name])
    node = f.message_type.add(name=name)
    for field_name in fields:
        kind = _FD.TYPE_BYTES if field_name in as_bytes else _TYPES[field_name]
        field = node.field.add(name=field_name, number=NODE_FIELDS[field_name], type=kind,
                               label=_FD.LABEL_REPEATED if field_name in _REPEATED else _FD.LABEL_OPTIONAL)
        if kind == _FD.TYPE_MESSAGE:
            field.type_name = _MESSAGE_TYPES[field_name]  # parsed (and its strings checked) as Chakra's
    pool.Add(f)
    descriptor = pool.FindMessageTypeByName(f"etweave_reduced.{name}")
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22; the floor (4.21) lacks it
    if get_class is not None:
        return cast(type[Message], get_class(descriptor))
    factory: Any = message_factory.MessageFactory(pool)  # GetPrototype: in 4.21, gone from the newer stubs
    return cast(type[Message], factory.GetPrototype(descriptor))
