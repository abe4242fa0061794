from buf.validate import validate_pb2 as _validate_pb2
from rollout.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppendRender(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPEND_RENDER_UNSPECIFIED: _ClassVar[AppendRender]
    APPEND_RENDER_WHOLE: _ClassVar[AppendRender]
    APPEND_RENDER_ISOLATED: _ClassVar[AppendRender]

class HistoryRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_RULE_UNSPECIFIED: _ClassVar[HistoryRule]
    HISTORY_RULE_REFUSE: _ClassVar[HistoryRule]
    HISTORY_RULE_RESTART: _ClassVar[HistoryRule]

class TokenSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_SOURCE_UNSPECIFIED: _ClassVar[TokenSource]
    TOKEN_SOURCE_PROMPT: _ClassVar[TokenSource]
    TOKEN_SOURCE_SAMPLED: _ClassVar[TokenSource]
    TOKEN_SOURCE_APPENDED: _ClassVar[TokenSource]
APPEND_RENDER_UNSPECIFIED: AppendRender
APPEND_RENDER_WHOLE: AppendRender
APPEND_RENDER_ISOLATED: AppendRender
HISTORY_RULE_UNSPECIFIED: HistoryRule
HISTORY_RULE_REFUSE: HistoryRule
HISTORY_RULE_RESTART: HistoryRule
TOKEN_SOURCE_UNSPECIFIED: TokenSource
TOKEN_SOURCE_PROMPT: TokenSource
TOKEN_SOURCE_SAMPLED: TokenSource
TOKEN_SOURCE_APPENDED: TokenSource

class OpenSessionRequest(_message.Message):
    __slots__ = ("prompt_token_ids", "prompt_text", "messages", "tools_json", "max_total_tokens", "lora_adapter", "pin_weight_version", "append_render", "resume", "history_rule")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPEND_RENDER_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_RULE_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    messages: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChatMessage]
    tools_json: _containers.RepeatedScalarFieldContainer[str]
    max_total_tokens: int
    lora_adapter: str
    pin_weight_version: bool
    append_render: AppendRender
    resume: SessionHistory
    history_rule: HistoryRule
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_generation_pb2.ChatMessage, _Mapping]]] = ..., tools_json: _Optional[_Iterable[str]] = ..., max_total_tokens: _Optional[int] = ..., lora_adapter: _Optional[str] = ..., pin_weight_version: bool = ..., append_render: _Optional[_Union[AppendRender, str]] = ..., resume: _Optional[_Union[SessionHistory, _Mapping]] = ..., history_rule: _Optional[_Union[HistoryRule, str]] = ...) -> None: ...

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
    messages: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[_generation_pb2.ChatMessage, _Mapping]]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "prompt_token_ids", "weight_version", "max_total_tokens", "idle_timeout_seconds", "base_url")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    weight_version: str
    max_total_tokens: int
    idle_timeout_seconds: float
    base_url: str
    def __init__(self, session_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., weight_version: _Optional[str] = ..., max_total_tokens: _Optional[int] = ..., idle_timeout_seconds: _Optional[float] = ..., base_url: _Optional[str] = ...) -> None: ...

class SessionGenerateRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "sampling_params", "required_weight_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    sampling_params: _generation_pb2.SamplingParams
    required_weight_version: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., sampling_params: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., required_weight_version: _Optional[str] = ...) -> None: ...

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
    completion: _generation_pb2.Completion
    weight_version: str
    usage: _generation_pb2.Usage
    state: SessionState
    lora_adapter_version: str
    def __init__(self, request_id: _Optional[str] = ..., completion: _Optional[_Union[_generation_pb2.Completion, _Mapping]] = ..., weight_version: _Optional[str] = ..., usage: _Optional[_Union[_generation_pb2.Usage, _Mapping]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ..., lora_adapter_version: _Optional[str] = ...) -> None: ...

class SessionGenerateStreamRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "sampling_params", "stream_options", "required_weight_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    STREAM_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    sampling_params: _generation_pb2.SamplingParams
    stream_options: _generation_pb2.StreamOptions
    required_weight_version: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., sampling_params: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., stream_options: _Optional[_Union[_generation_pb2.StreamOptions, _Mapping]] = ..., required_weight_version: _Optional[str] = ...) -> None: ...

class SessionGenerateStreamResponse(_message.Message):
    __slots__ = ("delta", "state")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    delta: _generation_pb2.GenerateStreamResponse
    state: SessionState
    def __init__(self, delta: _Optional[_Union[_generation_pb2.GenerateStreamResponse, _Mapping]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ...) -> None: ...

class AppendToSessionRequest(_message.Message):
    __slots__ = ("session_id", "token_ids", "messages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChatMessage]
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[_Union[_generation_pb2.ChatMessage, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("source", "start", "count", "finish_reason", "stop_reason", "resumed_at", "cached_prompt_tokens", "lora_adapter_version", "stop_token_id", "generation_prompt", "restarts_context")
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
    RESTARTS_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    source: TokenSource
    start: int
    count: int
    finish_reason: _generation_pb2.FinishReason
    stop_reason: str
    resumed_at: _containers.RepeatedScalarFieldContainer[int]
    cached_prompt_tokens: int
    lora_adapter_version: str
    stop_token_id: int
    generation_prompt: bool
    restarts_context: bool
    def __init__(self, source: _Optional[_Union[TokenSource, str]] = ..., start: _Optional[int] = ..., count: _Optional[int] = ..., finish_reason: _Optional[_Union[_generation_pb2.FinishReason, str]] = ..., stop_reason: _Optional[str] = ..., resumed_at: _Optional[_Iterable[int]] = ..., cached_prompt_tokens: _Optional[int] = ..., lora_adapter_version: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., generation_prompt: bool = ..., restarts_context: bool = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "from_segment", "include_messages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    from_segment: int
    include_messages: bool
    def __init__(self, session_id: _Optional[str] = ..., from_segment: _Optional[int] = ..., include_messages: bool = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session_id", "token_ids", "sources", "logprobs", "version_spans", "segments", "max_total_tokens", "pinned_weight_version", "busy", "resumed_tokens", "messages")
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
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sources: _containers.RepeatedScalarFieldContainer[TokenSource]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    version_spans: _containers.RepeatedCompositeFieldContainer[_generation_pb2.VersionSpan]
    segments: _containers.RepeatedCompositeFieldContainer[TrajectorySegment]
    max_total_tokens: int
    pinned_weight_version: str
    busy: bool
    resumed_tokens: int
    messages: _containers.RepeatedCompositeFieldContainer[SegmentMessages]
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sources: _Optional[_Iterable[_Union[TokenSource, str]]] = ..., logprobs: _Optional[_Iterable[float]] = ..., version_spans: _Optional[_Iterable[_Union[_generation_pb2.VersionSpan, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[TrajectorySegment, _Mapping]]] = ..., max_total_tokens: _Optional[int] = ..., pinned_weight_version: _Optional[str] = ..., busy: bool = ..., resumed_tokens: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[SegmentMessages, _Mapping]]] = ...) -> None: ...

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
