from buf.validate import validate_pb2 as _validate_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    D_TYPE_UNSPECIFIED: _ClassVar[DType]
    D_TYPE_BFLOAT16: _ClassVar[DType]
    D_TYPE_FLOAT16: _ClassVar[DType]
    D_TYPE_FLOAT32: _ClassVar[DType]
    D_TYPE_FLOAT8_E4M3FN: _ClassVar[DType]
    D_TYPE_FLOAT8_E5M2: _ClassVar[DType]
    D_TYPE_INT8: _ClassVar[DType]
    D_TYPE_UINT8: _ClassVar[DType]
    D_TYPE_INT16: _ClassVar[DType]
    D_TYPE_INT32: _ClassVar[DType]
    D_TYPE_INT64: _ClassVar[DType]
    D_TYPE_BOOL: _ClassVar[DType]
    D_TYPE_FLOAT64: _ClassVar[DType]

class TensorEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TENSOR_ENCODING_UNSPECIFIED: _ClassVar[TensorEncoding]
    TENSOR_ENCODING_RAW: _ClassVar[TensorEncoding]
    TENSOR_ENCODING_SPARSE_XOR16: _ClassVar[TensorEncoding]
    TENSOR_ENCODING_SPARSE_XOR16_ZSTD: _ClassVar[TensorEncoding]
    TENSOR_ENCODING_SPARSE_XOR8: _ClassVar[TensorEncoding]

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_WAIT: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
    PAUSE_MODE_KEEP: _ClassVar[PauseMode]

class AdapterAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADAPTER_ACTION_UNSPECIFIED: _ClassVar[AdapterAction]
    ADAPTER_ACTION_LOAD: _ClassVar[AdapterAction]
    ADAPTER_ACTION_REMOVE: _ClassVar[AdapterAction]

class CacheKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_KIND_UNSPECIFIED: _ClassVar[CacheKind]
    CACHE_KIND_PREFIX: _ClassVar[CacheKind]
    CACHE_KIND_MULTIMODAL: _ClassVar[CacheKind]
    CACHE_KIND_ENCODER: _ClassVar[CacheKind]
    CACHE_KIND_KV_CONNECTOR: _ClassVar[CacheKind]
D_TYPE_UNSPECIFIED: DType
D_TYPE_BFLOAT16: DType
D_TYPE_FLOAT16: DType
D_TYPE_FLOAT32: DType
D_TYPE_FLOAT8_E4M3FN: DType
D_TYPE_FLOAT8_E5M2: DType
D_TYPE_INT8: DType
D_TYPE_UINT8: DType
D_TYPE_INT16: DType
D_TYPE_INT32: DType
D_TYPE_INT64: DType
D_TYPE_BOOL: DType
D_TYPE_FLOAT64: DType
TENSOR_ENCODING_UNSPECIFIED: TensorEncoding
TENSOR_ENCODING_RAW: TensorEncoding
TENSOR_ENCODING_SPARSE_XOR16: TensorEncoding
TENSOR_ENCODING_SPARSE_XOR16_ZSTD: TensorEncoding
TENSOR_ENCODING_SPARSE_XOR8: TensorEncoding
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_WAIT: PauseMode
PAUSE_MODE_ABORT: PauseMode
PAUSE_MODE_KEEP: PauseMode
ADAPTER_ACTION_UNSPECIFIED: AdapterAction
ADAPTER_ACTION_LOAD: AdapterAction
ADAPTER_ACTION_REMOVE: AdapterAction
CACHE_KIND_UNSPECIFIED: CacheKind
CACHE_KIND_PREFIX: CacheKind
CACHE_KIND_MULTIMODAL: CacheKind
CACHE_KIND_ENCODER: CacheKind
CACHE_KIND_KV_CONNECTOR: CacheKind

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "crc32c", "encoding", "encoded_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    ENCODED_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    crc32c: int
    encoding: TensorEncoding
    encoded_bytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., crc32c: _Optional[int] = ..., encoding: _Optional[_Union[TensorEncoding, str]] = ..., encoded_bytes: _Optional[int] = ...) -> None: ...

class AdapterTarget(_message.Message):
    __slots__ = ("name", "action", "config_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    action: AdapterAction
    config_json: str
    def __init__(self, name: _Optional[str] = ..., action: _Optional[_Union[AdapterAction, str]] = ..., config_json: _Optional[str] = ...) -> None: ...

class UpdateWeightsBegin(_message.Message):
    __slots__ = ("weight_version", "tensors", "pause_mode", "drain_timeout_seconds", "adapter", "base_version")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    weight_version: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    pause_mode: PauseMode
    drain_timeout_seconds: float
    adapter: AdapterTarget
    base_version: str
    def __init__(self, weight_version: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., pause_mode: _Optional[_Union[PauseMode, str]] = ..., drain_timeout_seconds: _Optional[float] = ..., adapter: _Optional[_Union[AdapterTarget, _Mapping]] = ..., base_version: _Optional[str] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("tensor_index", "offset", "data")
    TENSOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    tensor_index: int
    offset: int
    data: bytes
    def __init__(self, tensor_index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorChunkBatch(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[TensorChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[TensorChunk, _Mapping]]] = ...) -> None: ...

class UpdateWeightsCommit(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("begin", "chunk", "commit", "chunks")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    begin: UpdateWeightsBegin
    chunk: TensorChunk
    commit: UpdateWeightsCommit
    chunks: TensorChunkBatch
    def __init__(self, begin: _Optional[_Union[UpdateWeightsBegin, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ..., commit: _Optional[_Union[UpdateWeightsCommit, _Mapping]] = ..., chunks: _Optional[_Union[TensorChunkBatch, _Mapping]] = ...) -> None: ...

class BeginUpdateRequest(_message.Message):
    __slots__ = ("begin", "same_host")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    SAME_HOST_FIELD_NUMBER: _ClassVar[int]
    begin: UpdateWeightsBegin
    same_host: bool
    def __init__(self, begin: _Optional[_Union[UpdateWeightsBegin, _Mapping]] = ..., same_host: bool = ...) -> None: ...

class SharedStaging(_message.Message):
    __slots__ = ("path", "tensor_offsets")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    path: str
    tensor_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, path: _Optional[str] = ..., tensor_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class BeginUpdateResponse(_message.Message):
    __slots__ = ("update_id", "total_bytes", "shared_staging", "idle_timeout_seconds")
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_STAGING_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    total_bytes: int
    shared_staging: SharedStaging
    idle_timeout_seconds: float
    def __init__(self, update_id: _Optional[str] = ..., total_bytes: _Optional[int] = ..., shared_staging: _Optional[_Union[SharedStaging, _Mapping]] = ..., idle_timeout_seconds: _Optional[float] = ...) -> None: ...

class UploadChunksRequest(_message.Message):
    __slots__ = ("update_id", "chunk", "chunks")
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    chunk: TensorChunk
    chunks: TensorChunkBatch
    def __init__(self, update_id: _Optional[str] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ..., chunks: _Optional[_Union[TensorChunkBatch, _Mapping]] = ...) -> None: ...

class UploadChunksResponse(_message.Message):
    __slots__ = ("bytes_received",)
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    bytes_received: int
    def __init__(self, bytes_received: _Optional[int] = ...) -> None: ...

class GetUpdateStatusRequest(_message.Message):
    __slots__ = ("update_id",)
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    def __init__(self, update_id: _Optional[str] = ...) -> None: ...

class ByteRange(_message.Message):
    __slots__ = ("tensor_index", "offset", "length")
    TENSOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    tensor_index: int
    offset: int
    length: int
    def __init__(self, tensor_index: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class GetUpdateStatusResponse(_message.Message):
    __slots__ = ("bytes_received", "total_bytes", "missing")
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    bytes_received: int
    total_bytes: int
    missing: _containers.RepeatedCompositeFieldContainer[ByteRange]
    def __init__(self, bytes_received: _Optional[int] = ..., total_bytes: _Optional[int] = ..., missing: _Optional[_Iterable[_Union[ByteRange, _Mapping]]] = ...) -> None: ...

class CommitUpdateRequest(_message.Message):
    __slots__ = ("update_id",)
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    def __init__(self, update_id: _Optional[str] = ...) -> None: ...

class CommitUpdateResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: UpdateWeightsResponse
    def __init__(self, result: _Optional[_Union[UpdateWeightsResponse, _Mapping]] = ...) -> None: ...

class AbortUpdateRequest(_message.Message):
    __slots__ = ("update_id",)
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    def __init__(self, update_id: _Optional[str] = ...) -> None: ...

class AbortUpdateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheResetResult(_message.Message):
    __slots__ = ("cache", "reset", "detail")
    CACHE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    cache: CacheKind
    reset: bool
    detail: str
    def __init__(self, cache: _Optional[_Union[CacheKind, str]] = ..., reset: bool = ..., detail: _Optional[str] = ...) -> None: ...

class UpdateTimings(_message.Message):
    __slots__ = ("receive_seconds", "apply_seconds", "reset_seconds", "admission_closed_seconds", "load_seconds", "decode_seconds", "check_seconds", "wait_seconds", "drain_seconds", "pause_seconds", "resume_seconds")
    RECEIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_CLOSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    receive_seconds: float
    apply_seconds: float
    reset_seconds: float
    admission_closed_seconds: float
    load_seconds: float
    decode_seconds: float
    check_seconds: float
    wait_seconds: float
    drain_seconds: float
    pause_seconds: float
    resume_seconds: float
    def __init__(self, receive_seconds: _Optional[float] = ..., apply_seconds: _Optional[float] = ..., reset_seconds: _Optional[float] = ..., admission_closed_seconds: _Optional[float] = ..., load_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., check_seconds: _Optional[float] = ..., wait_seconds: _Optional[float] = ..., drain_seconds: _Optional[float] = ..., pause_seconds: _Optional[float] = ..., resume_seconds: _Optional[float] = ...) -> None: ...

class KeepHeld(_message.Message):
    __slots__ = ("seconds", "phase", "reason", "requests_finished")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    phase: str
    reason: str
    requests_finished: int
    def __init__(self, seconds: _Optional[float] = ..., phase: _Optional[str] = ..., reason: _Optional[str] = ..., requests_finished: _Optional[int] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("weight_version", "bytes_received", "tensors_loaded", "caches_reset", "timings", "previous_weight_version", "replayed", "requests_aborted", "requests_kept", "keep_held")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TENSORS_LOADED_FIELD_NUMBER: _ClassVar[int]
    CACHES_RESET_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ABORTED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_KEPT_FIELD_NUMBER: _ClassVar[int]
    KEEP_HELD_FIELD_NUMBER: _ClassVar[int]
    weight_version: str
    bytes_received: int
    tensors_loaded: int
    caches_reset: _containers.RepeatedCompositeFieldContainer[CacheResetResult]
    timings: UpdateTimings
    previous_weight_version: str
    replayed: bool
    requests_aborted: int
    requests_kept: int
    keep_held: KeepHeld
    def __init__(self, weight_version: _Optional[str] = ..., bytes_received: _Optional[int] = ..., tensors_loaded: _Optional[int] = ..., caches_reset: _Optional[_Iterable[_Union[CacheResetResult, _Mapping]]] = ..., timings: _Optional[_Union[UpdateTimings, _Mapping]] = ..., previous_weight_version: _Optional[str] = ..., replayed: bool = ..., requests_aborted: _Optional[int] = ..., requests_kept: _Optional[int] = ..., keep_held: _Optional[_Union[KeepHeld, _Mapping]] = ...) -> None: ...
