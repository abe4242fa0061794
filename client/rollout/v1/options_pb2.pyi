from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_GENERATE: _ClassVar[Role]
    ROLE_ADMIN: _ClassVar[Role]
ROLE_UNSPECIFIED: Role
ROLE_GENERATE: Role
ROLE_ADMIN: Role
ROLE_FIELD_NUMBER: _ClassVar[int]
role: _descriptor.FieldDescriptor
