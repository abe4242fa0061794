from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_FIELD: _ClassVar[ErrorReason]
    ERROR_REASON_VERSION_ALREADY_SERVED: _ClassVar[ErrorReason]
    ERROR_REASON_UPDATE_IN_PROGRESS: _ClassVar[ErrorReason]
    ERROR_REASON_UPDATE_NOT_OPEN: _ClassVar[ErrorReason]
    ERROR_REASON_DEGRADED: _ClassVar[ErrorReason]
    ERROR_REASON_ENGINE_FAILURE: _ClassVar[ErrorReason]
    ERROR_REASON_QUEUE_FULL: _ClassVar[ErrorReason]
    ERROR_REASON_LIMIT_EXCEEDED: _ClassVar[ErrorReason]
    ERROR_REASON_AUTH_REQUIRED: _ClassVar[ErrorReason]
    ERROR_REASON_ROLE_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_STARTING: _ClassVar[ErrorReason]
    ERROR_REASON_ENGINE_DEAD: _ClassVar[ErrorReason]
    ERROR_REASON_ASLEEP: _ClassVar[ErrorReason]
    ERROR_REASON_SLEEP_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_ADAPTER_REMOVED: _ClassVar[ErrorReason]
    ERROR_REASON_UPDATE_IDLE_TIMEOUT: _ClassVar[ErrorReason]
    ERROR_REASON_INTERNAL_ERROR: _ClassVar[ErrorReason]
    ERROR_REASON_WRONG_WEIGHT_VERSION: _ClassVar[ErrorReason]
    ERROR_REASON_DELTA_BASE_MISMATCH: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_LOST: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_NOT_OWNED: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_BUSY: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_BUDGET: _ClassVar[ErrorReason]
    ERROR_REASON_TEMPLATE_NOT_APPEND_ONLY: _ClassVar[ErrorReason]
    ERROR_REASON_CALLER_QUEUE_FULL: _ClassVar[ErrorReason]
    ERROR_REASON_VERSION_REUSED: _ClassVar[ErrorReason]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_BUDGET: _ClassVar[FinishReason]

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

class LogprobsMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOGPROBS_MODE_UNSPECIFIED: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_RAW_LOGPROBS: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_RAW_LOGITS: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_PROCESSED_LOGPROBS: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_PROCESSED_LOGITS: _ClassVar[LogprobsMode]

class AppendRender(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPEND_RENDER_UNSPECIFIED: _ClassVar[AppendRender]
    APPEND_RENDER_WHOLE: _ClassVar[AppendRender]
    APPEND_RENDER_ISOLATED: _ClassVar[AppendRender]

class TokenSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_SOURCE_UNSPECIFIED: _ClassVar[TokenSource]
    TOKEN_SOURCE_PROMPT: _ClassVar[TokenSource]
    TOKEN_SOURCE_SAMPLED: _ClassVar[TokenSource]
    TOKEN_SOURCE_APPENDED: _ClassVar[TokenSource]
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_INVALID_FIELD: ErrorReason
ERROR_REASON_VERSION_ALREADY_SERVED: ErrorReason
ERROR_REASON_UPDATE_IN_PROGRESS: ErrorReason
ERROR_REASON_UPDATE_NOT_OPEN: ErrorReason
ERROR_REASON_DEGRADED: ErrorReason
ERROR_REASON_ENGINE_FAILURE: ErrorReason
ERROR_REASON_QUEUE_FULL: ErrorReason
ERROR_REASON_LIMIT_EXCEEDED: ErrorReason
ERROR_REASON_AUTH_REQUIRED: ErrorReason
ERROR_REASON_ROLE_DENIED: ErrorReason
ERROR_REASON_STARTING: ErrorReason
ERROR_REASON_ENGINE_DEAD: ErrorReason
ERROR_REASON_ASLEEP: ErrorReason
ERROR_REASON_SLEEP_UNAVAILABLE: ErrorReason
ERROR_REASON_ADAPTER_REMOVED: ErrorReason
ERROR_REASON_UPDATE_IDLE_TIMEOUT: ErrorReason
ERROR_REASON_INTERNAL_ERROR: ErrorReason
ERROR_REASON_WRONG_WEIGHT_VERSION: ErrorReason
ERROR_REASON_DELTA_BASE_MISMATCH: ErrorReason
ERROR_REASON_SESSION_NOT_FOUND: ErrorReason
ERROR_REASON_SESSION_LOST: ErrorReason
ERROR_REASON_SESSION_NOT_OWNED: ErrorReason
ERROR_REASON_SESSION_BUSY: ErrorReason
ERROR_REASON_SESSION_BUDGET: ErrorReason
ERROR_REASON_TEMPLATE_NOT_APPEND_ONLY: ErrorReason
ERROR_REASON_CALLER_QUEUE_FULL: ErrorReason
ERROR_REASON_VERSION_REUSED: ErrorReason
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_BUDGET: FinishReason
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
LOGPROBS_MODE_UNSPECIFIED: LogprobsMode
LOGPROBS_MODE_RAW_LOGPROBS: LogprobsMode
LOGPROBS_MODE_RAW_LOGITS: LogprobsMode
LOGPROBS_MODE_PROCESSED_LOGPROBS: LogprobsMode
LOGPROBS_MODE_PROCESSED_LOGITS: LogprobsMode
APPEND_RENDER_UNSPECIFIED: AppendRender
APPEND_RENDER_WHOLE: AppendRender
APPEND_RENDER_ISOLATED: AppendRender
TOKEN_SOURCE_UNSPECIFIED: TokenSource
TOKEN_SOURCE_PROMPT: TokenSource
TOKEN_SOURCE_SAMPLED: TokenSource
TOKEN_SOURCE_APPENDED: TokenSource

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "logprobs", "stop", "stop_token_ids", "ignore_eos", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens", "prompt_logprobs", "structured_output", "allowed_token_ids")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    n: int
    logprobs: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    prompt_logprobs: int
    structured_output: StructuredOutput
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., n: _Optional[int] = ..., logprobs: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: bool = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., min_tokens: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "regex", "choice", "grammar", "json_object")
    class Choices(_message.Message):
        __slots__ = ("choices",)
        CHOICES_FIELD_NUMBER: _ClassVar[int]
        choices: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    regex: str
    choice: StructuredOutput.Choices
    grammar: str
    json_object: bool
    def __init__(self, json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[StructuredOutput.Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., json_object: bool = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("text", "image")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    text: str
    image: Image
    def __init__(self, text: _Optional[str] = ..., image: _Optional[_Union[Image, _Mapping]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: _containers.RepeatedCompositeFieldContainer[ContentPart]
    def __init__(self, role: _Optional[str] = ..., content: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ...) -> None: ...

class ChatOptions(_message.Message):
    __slots__ = ("continue_final_message",)
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    continue_final_message: bool
    def __init__(self, continue_final_message: bool = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "prompt_text", "sampling_params", "images", "messages", "chat_options", "lora_adapter", "required_weight_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CHAT_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    sampling_params: SamplingParams
    images: _containers.RepeatedCompositeFieldContainer[Image]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    chat_options: ChatOptions
    lora_adapter: str
    required_weight_version: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., sampling_params: _Optional[_Union[SamplingParams, _Mapping]] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., chat_options: _Optional[_Union[ChatOptions, _Mapping]] = ..., lora_adapter: _Optional[str] = ..., required_weight_version: _Optional[str] = ...) -> None: ...

class TopLogprobs(_message.Message):
    __slots__ = ("token_ids", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("index", "token_ids", "logprobs", "finish_reason", "text", "top_logprobs", "stop_reason", "version_spans")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    text: str
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    stop_reason: str
    version_spans: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    def __init__(self, index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., text: _Optional[str] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ..., stop_reason: _Optional[str] = ..., version_spans: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ...) -> None: ...

class VersionSpan(_message.Message):
    __slots__ = ("weight_version", "start", "count")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    weight_version: str
    start: int
    count: int
    def __init__(self, weight_version: _Optional[str] = ..., start: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "completions", "weight_version", "usage", "prompt_token_ids", "prompt_logprobs", "prompt_top_logprobs", "lora_adapter_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    weight_version: str
    usage: Usage
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    lora_adapter_version: str
    def __init__(self, request_id: _Optional[str] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., weight_version: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[float]] = ..., prompt_top_logprobs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ..., lora_adapter_version: _Optional[str] = ...) -> None: ...

class GenerateStreamRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "prompt_text", "sampling_params", "images", "messages", "chat_options", "lora_adapter", "stream_options", "required_weight_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CHAT_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    STREAM_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    sampling_params: SamplingParams
    images: _containers.RepeatedCompositeFieldContainer[Image]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    chat_options: ChatOptions
    lora_adapter: str
    stream_options: StreamOptions
    required_weight_version: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., sampling_params: _Optional[_Union[SamplingParams, _Mapping]] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., chat_options: _Optional[_Union[ChatOptions, _Mapping]] = ..., lora_adapter: _Optional[str] = ..., stream_options: _Optional[_Union[StreamOptions, _Mapping]] = ..., required_weight_version: _Optional[str] = ...) -> None: ...

class GenerateManyRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: GenerateStreamRequest
    def __init__(self, request: _Optional[_Union[GenerateStreamRequest, _Mapping]] = ...) -> None: ...

class GenerateManyResponse(_message.Message):
    __slots__ = ("deltas", "failures")
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    deltas: _containers.RepeatedCompositeFieldContainer[GenerateStreamResponse]
    failures: _containers.RepeatedCompositeFieldContainer[GenerateFailure]
    def __init__(self, deltas: _Optional[_Iterable[_Union[GenerateStreamResponse, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[GenerateFailure, _Mapping]]] = ...) -> None: ...

class GenerateFailure(_message.Message):
    __slots__ = ("request_id", "code", "message", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    code: int
    message: str
    reason: ErrorReason
    def __init__(self, request_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[_Union[ErrorReason, str]] = ...) -> None: ...

class StreamOptions(_message.Message):
    __slots__ = ("delta_tokens", "omit_text")
    DELTA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OMIT_TEXT_FIELD_NUMBER: _ClassVar[int]
    delta_tokens: int
    omit_text: bool
    def __init__(self, delta_tokens: _Optional[int] = ..., omit_text: bool = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("request_id", "index", "token_ids", "logprobs", "top_logprobs", "text", "finish_reason", "weight_version", "usage", "stop_reason", "version_spans", "prompt_token_ids", "prompt_logprobs", "prompt_top_logprobs", "lora_adapter_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    text: str
    finish_reason: FinishReason
    weight_version: str
    usage: Usage
    stop_reason: str
    version_spans: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    lora_adapter_version: str
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., weight_version: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., stop_reason: _Optional[str] = ..., version_spans: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[float]] = ..., prompt_top_logprobs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ..., lora_adapter_version: _Optional[str] = ...) -> None: ...

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

class ResetCachesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetCachesResponse(_message.Message):
    __slots__ = ("results", "duration_seconds")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CacheResetResult]
    duration_seconds: float
    def __init__(self, results: _Optional[_Iterable[_Union[CacheResetResult, _Mapping]]] = ..., duration_seconds: _Optional[float] = ...) -> None: ...

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
    parameters: _containers.RepeatedCompositeFieldContainer[TensorSpec]
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
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., weight_version: _Optional[str] = ..., supports_images: bool = ..., parameters: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., max_message_bytes: _Optional[int] = ..., recommended_chunk_bytes: _Optional[int] = ..., max_update_bytes: _Optional[int] = ..., max_logprobs: _Optional[int] = ..., server_version: _Optional[str] = ..., degraded: bool = ..., engine_requests: _Optional[int] = ..., parameter_groups: _Optional[_Iterable[_Union[ParameterGroup, _Mapping]]] = ..., drain_timeout_seconds: _Optional[float] = ..., logprobs_mode: _Optional[_Union[LogprobsMode, str]] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., lora_adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ..., lora_limits: _Optional[_Union[LoraLimits, _Mapping]] = ..., supports_sleep: bool = ..., sleeping: bool = ..., max_generations_per_stream: _Optional[int] = ..., max_stream_tokens: _Optional[int] = ..., delta_base_version: _Optional[str] = ..., delta_base_bytes: _Optional[int] = ..., accepts_chunk_batches: bool = ..., session_limits: _Optional[_Union[SessionLimits, _Mapping]] = ..., open_sessions: _Optional[int] = ..., fair_share: _Optional[_Union[FairShareInfo, _Mapping]] = ...) -> None: ...

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

class AbortRequest(_message.Message):
    __slots__ = ("request_ids", "all")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., all: bool = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "messages", "chat_options", "add_special_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CHAT_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    chat_options: ChatOptions
    add_special_tokens: bool
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., chat_options: _Optional[_Union[ChatOptions, _Mapping]] = ..., add_special_tokens: bool = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("token_ids", "skip_special_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    skip_special_tokens: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., skip_special_tokens: bool = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

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

class OpenSessionRequest(_message.Message):
    __slots__ = ("prompt_token_ids", "prompt_text", "messages", "tools_json", "max_total_tokens", "lora_adapter", "pin_weight_version", "append_render", "resume")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPEND_RENDER_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools_json: _containers.RepeatedScalarFieldContainer[str]
    max_total_tokens: int
    lora_adapter: str
    pin_weight_version: bool
    append_render: AppendRender
    resume: SessionHistory
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools_json: _Optional[_Iterable[str]] = ..., max_total_tokens: _Optional[int] = ..., lora_adapter: _Optional[str] = ..., pin_weight_version: bool = ..., append_render: _Optional[_Union[AppendRender, str]] = ..., resume: _Optional[_Union[SessionHistory, _Mapping]] = ...) -> None: ...

class SessionHistory(_message.Message):
    __slots__ = ("trajectory", "messages")
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    trajectory: GetSessionResponse
    messages: _containers.RepeatedCompositeFieldContainer[SegmentMessages]
    def __init__(self, trajectory: _Optional[_Union[GetSessionResponse, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[SegmentMessages, _Mapping]]] = ...) -> None: ...

class SegmentMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "prompt_token_ids", "weight_version", "max_total_tokens", "idle_timeout_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    weight_version: str
    max_total_tokens: int
    idle_timeout_seconds: float
    def __init__(self, session_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., weight_version: _Optional[str] = ..., max_total_tokens: _Optional[int] = ..., idle_timeout_seconds: _Optional[float] = ...) -> None: ...

class SessionGenerateRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "sampling_params", "required_weight_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    sampling_params: SamplingParams
    required_weight_version: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., sampling_params: _Optional[_Union[SamplingParams, _Mapping]] = ..., required_weight_version: _Optional[str] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("segment_index", "total_tokens", "budget_remaining", "generation_prompt_token_ids", "resumed")
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_REMAINING_FIELD_NUMBER: _ClassVar[int]
    GENERATION_PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    segment_index: int
    total_tokens: int
    budget_remaining: int
    generation_prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    resumed: bool
    def __init__(self, segment_index: _Optional[int] = ..., total_tokens: _Optional[int] = ..., budget_remaining: _Optional[int] = ..., generation_prompt_token_ids: _Optional[_Iterable[int]] = ..., resumed: bool = ...) -> None: ...

class SessionGenerateResponse(_message.Message):
    __slots__ = ("request_id", "completion", "weight_version", "usage", "state", "lora_adapter_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    completion: Completion
    weight_version: str
    usage: Usage
    state: SessionState
    lora_adapter_version: str
    def __init__(self, request_id: _Optional[str] = ..., completion: _Optional[_Union[Completion, _Mapping]] = ..., weight_version: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ..., lora_adapter_version: _Optional[str] = ...) -> None: ...

class SessionGenerateStreamRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "sampling_params", "stream_options", "required_weight_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    STREAM_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    sampling_params: SamplingParams
    stream_options: StreamOptions
    required_weight_version: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., sampling_params: _Optional[_Union[SamplingParams, _Mapping]] = ..., stream_options: _Optional[_Union[StreamOptions, _Mapping]] = ..., required_weight_version: _Optional[str] = ...) -> None: ...

class SessionGenerateStreamResponse(_message.Message):
    __slots__ = ("delta", "state")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    delta: GenerateStreamResponse
    state: SessionState
    def __init__(self, delta: _Optional[_Union[GenerateStreamResponse, _Mapping]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ...) -> None: ...

class AppendToSessionRequest(_message.Message):
    __slots__ = ("session_id", "token_ids", "messages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class AppendToSessionResponse(_message.Message):
    __slots__ = ("token_ids", "total_tokens", "budget_remaining")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_REMAINING_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    total_tokens: int
    budget_remaining: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., total_tokens: _Optional[int] = ..., budget_remaining: _Optional[int] = ...) -> None: ...

class TrajectorySegment(_message.Message):
    __slots__ = ("source", "start", "count", "finish_reason", "stop_reason", "resumed_at", "cached_prompt_tokens", "lora_adapter_version", "stop_token_id", "generation_prompt")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    RESUMED_AT_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    source: TokenSource
    start: int
    count: int
    finish_reason: FinishReason
    stop_reason: str
    resumed_at: _containers.RepeatedScalarFieldContainer[int]
    cached_prompt_tokens: int
    lora_adapter_version: str
    stop_token_id: int
    generation_prompt: bool
    def __init__(self, source: _Optional[_Union[TokenSource, str]] = ..., start: _Optional[int] = ..., count: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_reason: _Optional[str] = ..., resumed_at: _Optional[_Iterable[int]] = ..., cached_prompt_tokens: _Optional[int] = ..., lora_adapter_version: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., generation_prompt: bool = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "from_segment")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    from_segment: int
    def __init__(self, session_id: _Optional[str] = ..., from_segment: _Optional[int] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session_id", "token_ids", "sources", "logprobs", "version_spans", "segments", "max_total_tokens", "pinned_weight_version", "busy", "resumed_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PINNED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sources: _containers.RepeatedScalarFieldContainer[TokenSource]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    version_spans: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    segments: _containers.RepeatedCompositeFieldContainer[TrajectorySegment]
    max_total_tokens: int
    pinned_weight_version: str
    busy: bool
    resumed_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sources: _Optional[_Iterable[_Union[TokenSource, str]]] = ..., logprobs: _Optional[_Iterable[float]] = ..., version_spans: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[TrajectorySegment, _Mapping]]] = ..., max_total_tokens: _Optional[int] = ..., pinned_weight_version: _Optional[str] = ..., busy: bool = ..., resumed_tokens: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("aborted_turn",)
    ABORTED_TURN_FIELD_NUMBER: _ClassVar[int]
    aborted_turn: bool
    def __init__(self, aborted_turn: bool = ...) -> None: ...
