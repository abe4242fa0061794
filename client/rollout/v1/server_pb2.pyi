from buf.validate import validate_pb2 as _validate_pb2
from rollout.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LogprobsMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOGPROBS_MODE_UNSPECIFIED: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_RAW_LOGPROBS: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_RAW_LOGITS: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_PROCESSED_LOGPROBS: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_PROCESSED_LOGITS: _ClassVar[LogprobsMode]
LOGPROBS_MODE_UNSPECIFIED: LogprobsMode
LOGPROBS_MODE_RAW_LOGPROBS: LogprobsMode
LOGPROBS_MODE_RAW_LOGITS: LogprobsMode
LOGPROBS_MODE_PROCESSED_LOGPROBS: LogprobsMode
LOGPROBS_MODE_PROCESSED_LOGITS: LogprobsMode

class ResetCachesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetCachesResponse(_message.Message):
    __slots__ = ("results", "duration_seconds")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_weights_pb2.CacheResetResult]
    duration_seconds: float
    def __init__(self, results: _Optional[_Iterable[_Union[_weights_pb2.CacheResetResult, _Mapping]]] = ..., duration_seconds: _Optional[float] = ...) -> None: ...

class ParameterGroup(_message.Message):
    __slots__ = ("module", "names")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    module: str
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, module: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("model", "max_model_len", "vocab_size", "weight_version", "supports_images", "parameters", "max_message_bytes", "recommended_chunk_bytes", "max_update_bytes", "max_logprobs", "server_version", "degraded", "engine_requests", "parameter_groups", "drain_timeout_seconds", "logprobs_mode", "tokenizer", "lora_adapters", "lora_limits", "supports_sleep", "sleeping", "max_generations_per_stream", "max_stream_tokens", "delta_base_version", "delta_base_bytes", "accepts_chunk_batches", "session_limits", "open_sessions", "fair_share")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_IMAGES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_UPDATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    ENGINE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_MODE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    LORA_LIMITS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_SLEEP_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    MAX_GENERATIONS_PER_STREAM_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_CHUNK_BATCHES_FIELD_NUMBER: _ClassVar[int]
    SESSION_LIMITS_FIELD_NUMBER: _ClassVar[int]
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_model_len: int
    vocab_size: int
    weight_version: str
    supports_images: bool
    parameters: _containers.RepeatedCompositeFieldContainer[_weights_pb2.TensorSpec]
    max_message_bytes: int
    recommended_chunk_bytes: int
    max_update_bytes: int
    max_logprobs: int
    server_version: str
    degraded: bool
    engine_requests: int
    parameter_groups: _containers.RepeatedCompositeFieldContainer[ParameterGroup]
    drain_timeout_seconds: float
    logprobs_mode: LogprobsMode
    tokenizer: TokenizerInfo
    lora_adapters: _containers.RepeatedCompositeFieldContainer[LoraAdapter]
    lora_limits: LoraLimits
    supports_sleep: bool
    sleeping: bool
    max_generations_per_stream: int
    max_stream_tokens: int
    delta_base_version: str
    delta_base_bytes: int
    accepts_chunk_batches: bool
    session_limits: SessionLimits
    open_sessions: int
    fair_share: FairShareInfo
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., weight_version: _Optional[str] = ..., supports_images: bool = ..., parameters: _Optional[_Iterable[_Union[_weights_pb2.TensorSpec, _Mapping]]] = ..., max_message_bytes: _Optional[int] = ..., recommended_chunk_bytes: _Optional[int] = ..., max_update_bytes: _Optional[int] = ..., max_logprobs: _Optional[int] = ..., server_version: _Optional[str] = ..., degraded: bool = ..., engine_requests: _Optional[int] = ..., parameter_groups: _Optional[_Iterable[_Union[ParameterGroup, _Mapping]]] = ..., drain_timeout_seconds: _Optional[float] = ..., logprobs_mode: _Optional[_Union[LogprobsMode, str]] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., lora_adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ..., lora_limits: _Optional[_Union[LoraLimits, _Mapping]] = ..., supports_sleep: bool = ..., sleeping: bool = ..., max_generations_per_stream: _Optional[int] = ..., max_stream_tokens: _Optional[int] = ..., delta_base_version: _Optional[str] = ..., delta_base_bytes: _Optional[int] = ..., accepts_chunk_batches: bool = ..., session_limits: _Optional[_Union[SessionLimits, _Mapping]] = ..., open_sessions: _Optional[int] = ..., fair_share: _Optional[_Union[FairShareInfo, _Mapping]] = ...) -> None: ...

class FairShareInfo(_message.Message):
    __slots__ = ("enabled", "shares", "max_requests_per_caller", "callers", "engine_seats_per_caller")
    class SharesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUESTS_PER_CALLER_FIELD_NUMBER: _ClassVar[int]
    CALLERS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SEATS_PER_CALLER_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    shares: _containers.ScalarMap[str, int]
    max_requests_per_caller: int
    callers: _containers.RepeatedCompositeFieldContainer[CallerLoad]
    engine_seats_per_caller: int
    def __init__(self, enabled: bool = ..., shares: _Optional[_Mapping[str, int]] = ..., max_requests_per_caller: _Optional[int] = ..., callers: _Optional[_Iterable[_Union[CallerLoad, _Mapping]]] = ..., engine_seats_per_caller: _Optional[int] = ...) -> None: ...

class CallerLoad(_message.Message):
    __slots__ = ("caller", "share", "in_flight", "in_engine")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    IN_ENGINE_FIELD_NUMBER: _ClassVar[int]
    caller: str
    share: int
    in_flight: int
    in_engine: int
    def __init__(self, caller: _Optional[str] = ..., share: _Optional[int] = ..., in_flight: _Optional[int] = ..., in_engine: _Optional[int] = ...) -> None: ...

class SessionLimits(_message.Message):
    __slots__ = ("max_sessions", "max_sessions_per_caller", "max_session_tokens", "bytes_per_held_token", "idle_timeout_seconds", "max_total_tokens", "max_segments", "bytes_per_segment")
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_PER_CALLER_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_HELD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    max_sessions: int
    max_sessions_per_caller: int
    max_session_tokens: int
    bytes_per_held_token: int
    idle_timeout_seconds: float
    max_total_tokens: int
    max_segments: int
    bytes_per_segment: int
    def __init__(self, max_sessions: _Optional[int] = ..., max_sessions_per_caller: _Optional[int] = ..., max_session_tokens: _Optional[int] = ..., bytes_per_held_token: _Optional[int] = ..., idle_timeout_seconds: _Optional[float] = ..., max_total_tokens: _Optional[int] = ..., max_segments: _Optional[int] = ..., bytes_per_segment: _Optional[int] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("eos_token_ids", "bos_token_id", "pad_token_id", "has_chat_template", "image_placeholder", "image_token_id")
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token_id: int
    pad_token_id: int
    has_chat_template: bool
    image_placeholder: str
    image_token_id: int
    def __init__(self, eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token_id: _Optional[int] = ..., pad_token_id: _Optional[int] = ..., has_chat_template: bool = ..., image_placeholder: _Optional[str] = ..., image_token_id: _Optional[int] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "weight_version", "rank")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight_version: str
    rank: int
    def __init__(self, name: _Optional[str] = ..., weight_version: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class LoraLimits(_message.Message):
    __slots__ = ("enabled", "max_rank", "max_loras", "max_loaded")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOADED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    max_rank: int
    max_loras: int
    max_loaded: int
    def __init__(self, enabled: bool = ..., max_rank: _Optional[int] = ..., max_loras: _Optional[int] = ..., max_loaded: _Optional[int] = ...) -> None: ...

class SleepRequest(_message.Message):
    __slots__ = ("level",)
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    level: int
    def __init__(self, level: _Optional[int] = ...) -> None: ...

class SleepResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WakeUpRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WakeUpResponse(_message.Message):
    __slots__ = ("needs_weights",)
    NEEDS_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    needs_weights: bool
    def __init__(self, needs_weights: bool = ...) -> None: ...
