from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ALL_GATHER: CollectiveCommType
ALL_REDUCE: CollectiveCommType
ALL_TO_ALL: CollectiveCommType
BARRIER: CollectiveCommType
BROADCAST: CollectiveCommType
COMM_COLL_NODE: NodeType
COMM_RECV_NODE: NodeType
COMM_SEND_NODE: NodeType
COMP_NODE: NodeType
DESCRIPTOR: _descriptor.FileDescriptor
GATHER: CollectiveCommType
INVALID_NODE: NodeType
MEM_LOAD_NODE: NodeType
MEM_STORE_NODE: NodeType
METADATA_NODE: NodeType
REDUCE: CollectiveCommType
REDUCE_SCATTER: CollectiveCommType
REDUCE_SCATTER_BLOCK: CollectiveCommType
SCATTER: CollectiveCommType

class AttributeProto(_message.Message):
    __slots__ = ["bool_list", "bool_val", "bytes_list", "bytes_val", "doc_string", "double_list", "double_val", "fixed32_list", "fixed32_val", "fixed64_list", "fixed64_val", "float_list", "float_val", "int32_list", "int32_val", "int64_list", "int64_val", "name", "sfixed32_list", "sfixed32_val", "sfixed64_list", "sfixed64_val", "sint32_list", "sint32_val", "sint64_list", "sint64_val", "string_list", "string_val", "uint32_list", "uint32_val", "uint64_list", "uint64_val"]
    BOOL_LIST_FIELD_NUMBER: _ClassVar[int]
    BOOL_VAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_LIST_FIELD_NUMBER: _ClassVar[int]
    BYTES_VAL_FIELD_NUMBER: _ClassVar[int]
    DOC_STRING_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_LIST_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VAL_FIELD_NUMBER: _ClassVar[int]
    FIXED32_LIST_FIELD_NUMBER: _ClassVar[int]
    FIXED32_VAL_FIELD_NUMBER: _ClassVar[int]
    FIXED64_LIST_FIELD_NUMBER: _ClassVar[int]
    FIXED64_VAL_FIELD_NUMBER: _ClassVar[int]
    FLOAT_LIST_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VAL_FIELD_NUMBER: _ClassVar[int]
    INT32_LIST_FIELD_NUMBER: _ClassVar[int]
    INT32_VAL_FIELD_NUMBER: _ClassVar[int]
    INT64_LIST_FIELD_NUMBER: _ClassVar[int]
    INT64_VAL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SFIXED32_LIST_FIELD_NUMBER: _ClassVar[int]
    SFIXED32_VAL_FIELD_NUMBER: _ClassVar[int]
    SFIXED64_LIST_FIELD_NUMBER: _ClassVar[int]
    SFIXED64_VAL_FIELD_NUMBER: _ClassVar[int]
    SINT32_LIST_FIELD_NUMBER: _ClassVar[int]
    SINT32_VAL_FIELD_NUMBER: _ClassVar[int]
    SINT64_LIST_FIELD_NUMBER: _ClassVar[int]
    SINT64_VAL_FIELD_NUMBER: _ClassVar[int]
    STRING_LIST_FIELD_NUMBER: _ClassVar[int]
    STRING_VAL_FIELD_NUMBER: _ClassVar[int]
    UINT32_LIST_FIELD_NUMBER: _ClassVar[int]
    UINT32_VAL_FIELD_NUMBER: _ClassVar[int]
    UINT64_LIST_FIELD_NUMBER: _ClassVar[int]
    UINT64_VAL_FIELD_NUMBER: _ClassVar[int]
    bool_list: BoolList
    bool_val: bool
    bytes_list: BytesList
    bytes_val: bytes
    doc_string: str
    double_list: DoubleList
    double_val: float
    fixed32_list: Fixed32List
    fixed32_val: int
    fixed64_list: Fixed64List
    fixed64_val: int
    float_list: FloatList
    float_val: float
    int32_list: Int32List
    int32_val: int
    int64_list: Int64List
    int64_val: int
    name: str
    sfixed32_list: Sfixed32List
    sfixed32_val: int
    sfixed64_list: Sfixed64List
    sfixed64_val: int
    sint32_list: Sint32List
    sint32_val: int
    sint64_list: Sint64List
    sint64_val: int
    string_list: StringList
    string_val: str
    uint32_list: Uint32List
    uint32_val: int
    uint64_list: Uint64List
    uint64_val: int
    def __init__(self, name: _Optional[str] = ..., doc_string: _Optional[str] = ..., double_val: _Optional[float] = ..., double_list: _Optional[_Union[DoubleList, _Mapping]] = ..., float_val: _Optional[float] = ..., float_list: _Optional[_Union[FloatList, _Mapping]] = ..., int32_val: _Optional[int] = ..., int32_list: _Optional[_Union[Int32List, _Mapping]] = ..., int64_val: _Optional[int] = ..., int64_list: _Optional[_Union[Int64List, _Mapping]] = ..., uint32_val: _Optional[int] = ..., uint32_list: _Optional[_Union[Uint32List, _Mapping]] = ..., uint64_val: _Optional[int] = ..., uint64_list: _Optional[_Union[Uint64List, _Mapping]] = ..., sint32_val: _Optional[int] = ..., sint32_list: _Optional[_Union[Sint32List, _Mapping]] = ..., sint64_val: _Optional[int] = ..., sint64_list: _Optional[_Union[Sint64List, _Mapping]] = ..., fixed32_val: _Optional[int] = ..., fixed32_list: _Optional[_Union[Fixed32List, _Mapping]] = ..., fixed64_val: _Optional[int] = ..., fixed64_list: _Optional[_Union[Fixed64List, _Mapping]] = ..., sfixed32_val: _Optional[int] = ..., sfixed32_list: _Optional[_Union[Sfixed32List, _Mapping]] = ..., sfixed64_val: _Optional[int] = ..., sfixed64_list: _Optional[_Union[Sfixed64List, _Mapping]] = ..., bool_val: bool = ..., bool_list: _Optional[_Union[BoolList, _Mapping]] = ..., string_val: _Optional[str] = ..., string_list: _Optional[_Union[StringList, _Mapping]] = ..., bytes_val: _Optional[bytes] = ..., bytes_list: _Optional[_Union[BytesList, _Mapping]] = ...) -> None: ...

class BoolList(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, values: _Optional[_Iterable[bool]] = ...) -> None: ...

class BytesList(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DoubleList(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class Fixed32List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Fixed64List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class FloatList(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class GlobalMetadata(_message.Message):
    __slots__ = ["attr", "version"]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    attr: _containers.RepeatedCompositeFieldContainer[AttributeProto]
    version: str
    def __init__(self, version: _Optional[str] = ..., attr: _Optional[_Iterable[_Union[AttributeProto, _Mapping]]] = ...) -> None: ...

class IOInfo(_message.Message):
    __slots__ = ["shapes", "types", "values"]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    shapes: str
    types: str
    values: str
    def __init__(self, values: _Optional[str] = ..., shapes: _Optional[str] = ..., types: _Optional[str] = ...) -> None: ...

class Int32List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Int64List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ["attr", "ctrl_deps", "data_deps", "duration_micros", "id", "inputs", "name", "outputs", "start_time_micros", "type"]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    CTRL_DEPS_FIELD_NUMBER: _ClassVar[int]
    DATA_DEPS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MICROS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_MICROS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    attr: _containers.RepeatedCompositeFieldContainer[AttributeProto]
    ctrl_deps: _containers.RepeatedScalarFieldContainer[int]
    data_deps: _containers.RepeatedScalarFieldContainer[int]
    duration_micros: int
    id: int
    inputs: IOInfo
    name: str
    outputs: IOInfo
    start_time_micros: int
    type: NodeType
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., type: _Optional[_Union[NodeType, str]] = ..., ctrl_deps: _Optional[_Iterable[int]] = ..., data_deps: _Optional[_Iterable[int]] = ..., start_time_micros: _Optional[int] = ..., duration_micros: _Optional[int] = ..., inputs: _Optional[_Union[IOInfo, _Mapping]] = ..., outputs: _Optional[_Union[IOInfo, _Mapping]] = ..., attr: _Optional[_Iterable[_Union[AttributeProto, _Mapping]]] = ...) -> None: ...

class Sfixed32List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Sfixed64List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Sint32List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Sint64List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class Uint32List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Uint64List(_message.Message):
    __slots__ = ["values"]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class NodeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CollectiveCommType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
