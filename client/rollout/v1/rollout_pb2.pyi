from rollout.v1 import errors_pb2 as _errors_pb2
from rollout.v1 import generation_pb2 as _generation_pb2
from rollout.v1 import options_pb2 as _options_pb2
from rollout.v1 import server_pb2 as _server_pb2
from rollout.v1 import sessions_pb2 as _sessions_pb2
from rollout.v1 import weights_pb2 as _weights_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar
from rollout.v1.errors_pb2 import ErrorReason as ErrorReason
from rollout.v1.generation_pb2 import SamplingParams as SamplingParams
from rollout.v1.generation_pb2 import StructuredOutput as StructuredOutput
from rollout.v1.generation_pb2 import Image as Image
from rollout.v1.generation_pb2 import ContentPart as ContentPart
from rollout.v1.generation_pb2 import ChatMessage as ChatMessage
from rollout.v1.generation_pb2 import ToolCall as ToolCall
from rollout.v1.generation_pb2 import ChatOptions as ChatOptions
from rollout.v1.generation_pb2 import GenerateRequest as GenerateRequest
from rollout.v1.generation_pb2 import TopLogprobs as TopLogprobs
from rollout.v1.generation_pb2 import Completion as Completion
from rollout.v1.generation_pb2 import VersionSpan as VersionSpan
from rollout.v1.generation_pb2 import Usage as Usage
from rollout.v1.generation_pb2 import GenerateResponse as GenerateResponse
from rollout.v1.generation_pb2 import GenerateStreamRequest as GenerateStreamRequest
from rollout.v1.generation_pb2 import GenerateManyRequest as GenerateManyRequest
from rollout.v1.generation_pb2 import GenerateManyResponse as GenerateManyResponse
from rollout.v1.generation_pb2 import GenerateFailure as GenerateFailure
from rollout.v1.generation_pb2 import StreamOptions as StreamOptions
from rollout.v1.generation_pb2 import GenerateStreamResponse as GenerateStreamResponse
from rollout.v1.generation_pb2 import AbortRequest as AbortRequest
from rollout.v1.generation_pb2 import AbortResponse as AbortResponse
from rollout.v1.generation_pb2 import TokenizeRequest as TokenizeRequest
from rollout.v1.generation_pb2 import TokenizeResponse as TokenizeResponse
from rollout.v1.generation_pb2 import DetokenizeRequest as DetokenizeRequest
from rollout.v1.generation_pb2 import DetokenizeResponse as DetokenizeResponse
from rollout.v1.generation_pb2 import FinishReason as FinishReason
from rollout.v1.server_pb2 import ResetCachesRequest as ResetCachesRequest
from rollout.v1.server_pb2 import ResetCachesResponse as ResetCachesResponse
from rollout.v1.server_pb2 import ParameterGroup as ParameterGroup
from rollout.v1.server_pb2 import GetServerInfoRequest as GetServerInfoRequest
from rollout.v1.server_pb2 import GetServerInfoResponse as GetServerInfoResponse
from rollout.v1.server_pb2 import FairShareInfo as FairShareInfo
from rollout.v1.server_pb2 import CallerLoad as CallerLoad
from rollout.v1.server_pb2 import SessionLimits as SessionLimits
from rollout.v1.server_pb2 import TokenizerInfo as TokenizerInfo
from rollout.v1.server_pb2 import LoraAdapter as LoraAdapter
from rollout.v1.server_pb2 import LoraLimits as LoraLimits
from rollout.v1.server_pb2 import SleepRequest as SleepRequest
from rollout.v1.server_pb2 import SleepResponse as SleepResponse
from rollout.v1.server_pb2 import WakeUpRequest as WakeUpRequest
from rollout.v1.server_pb2 import WakeUpResponse as WakeUpResponse
from rollout.v1.server_pb2 import LogprobsMode as LogprobsMode
from rollout.v1.sessions_pb2 import OpenSessionRequest as OpenSessionRequest
from rollout.v1.sessions_pb2 import SessionHistory as SessionHistory
from rollout.v1.sessions_pb2 import SegmentMessages as SegmentMessages
from rollout.v1.sessions_pb2 import OpenSessionResponse as OpenSessionResponse
from rollout.v1.sessions_pb2 import SessionGenerateRequest as SessionGenerateRequest
from rollout.v1.sessions_pb2 import SessionState as SessionState
from rollout.v1.sessions_pb2 import SessionGenerateResponse as SessionGenerateResponse
from rollout.v1.sessions_pb2 import SessionGenerateStreamRequest as SessionGenerateStreamRequest
from rollout.v1.sessions_pb2 import SessionGenerateStreamResponse as SessionGenerateStreamResponse
from rollout.v1.sessions_pb2 import AppendToSessionRequest as AppendToSessionRequest
from rollout.v1.sessions_pb2 import AppendToSessionResponse as AppendToSessionResponse
from rollout.v1.sessions_pb2 import TrajectorySegment as TrajectorySegment
from rollout.v1.sessions_pb2 import GetSessionRequest as GetSessionRequest
from rollout.v1.sessions_pb2 import GetSessionResponse as GetSessionResponse
from rollout.v1.sessions_pb2 import CloseSessionRequest as CloseSessionRequest
from rollout.v1.sessions_pb2 import CloseSessionResponse as CloseSessionResponse
from rollout.v1.sessions_pb2 import AppendRender as AppendRender
from rollout.v1.sessions_pb2 import HistoryRule as HistoryRule
from rollout.v1.sessions_pb2 import TokenSource as TokenSource
from rollout.v1.weights_pb2 import TensorSpec as TensorSpec
from rollout.v1.weights_pb2 import AdapterTarget as AdapterTarget
from rollout.v1.weights_pb2 import UpdateWeightsBegin as UpdateWeightsBegin
from rollout.v1.weights_pb2 import TensorChunk as TensorChunk
from rollout.v1.weights_pb2 import TensorChunkBatch as TensorChunkBatch
from rollout.v1.weights_pb2 import UpdateWeightsCommit as UpdateWeightsCommit
from rollout.v1.weights_pb2 import UpdateWeightsRequest as UpdateWeightsRequest
from rollout.v1.weights_pb2 import BeginUpdateRequest as BeginUpdateRequest
from rollout.v1.weights_pb2 import SharedStaging as SharedStaging
from rollout.v1.weights_pb2 import BeginUpdateResponse as BeginUpdateResponse
from rollout.v1.weights_pb2 import UploadChunksRequest as UploadChunksRequest
from rollout.v1.weights_pb2 import UploadChunksResponse as UploadChunksResponse
from rollout.v1.weights_pb2 import GetUpdateStatusRequest as GetUpdateStatusRequest
from rollout.v1.weights_pb2 import ByteRange as ByteRange
from rollout.v1.weights_pb2 import GetUpdateStatusResponse as GetUpdateStatusResponse
from rollout.v1.weights_pb2 import CommitUpdateRequest as CommitUpdateRequest
from rollout.v1.weights_pb2 import CommitUpdateResponse as CommitUpdateResponse
from rollout.v1.weights_pb2 import AbortUpdateRequest as AbortUpdateRequest
from rollout.v1.weights_pb2 import AbortUpdateResponse as AbortUpdateResponse
from rollout.v1.weights_pb2 import CacheResetResult as CacheResetResult
from rollout.v1.weights_pb2 import UpdateTimings as UpdateTimings
from rollout.v1.weights_pb2 import KeepHeld as KeepHeld
from rollout.v1.weights_pb2 import UpdateWeightsResponse as UpdateWeightsResponse
from rollout.v1.weights_pb2 import DType as DType
from rollout.v1.weights_pb2 import TensorEncoding as TensorEncoding
from rollout.v1.weights_pb2 import PauseMode as PauseMode
from rollout.v1.weights_pb2 import AdapterAction as AdapterAction
from rollout.v1.weights_pb2 import CacheKind as CacheKind

DESCRIPTOR: _descriptor.FileDescriptor
ERROR_REASON_UNSPECIFIED: _errors_pb2.ErrorReason
ERROR_REASON_INVALID_FIELD: _errors_pb2.ErrorReason
ERROR_REASON_VERSION_ALREADY_SERVED: _errors_pb2.ErrorReason
ERROR_REASON_UPDATE_IN_PROGRESS: _errors_pb2.ErrorReason
ERROR_REASON_UPDATE_NOT_OPEN: _errors_pb2.ErrorReason
ERROR_REASON_DEGRADED: _errors_pb2.ErrorReason
ERROR_REASON_ENGINE_FAILURE: _errors_pb2.ErrorReason
ERROR_REASON_QUEUE_FULL: _errors_pb2.ErrorReason
ERROR_REASON_LIMIT_EXCEEDED: _errors_pb2.ErrorReason
ERROR_REASON_AUTH_REQUIRED: _errors_pb2.ErrorReason
ERROR_REASON_ROLE_DENIED: _errors_pb2.ErrorReason
ERROR_REASON_STARTING: _errors_pb2.ErrorReason
ERROR_REASON_ENGINE_DEAD: _errors_pb2.ErrorReason
ERROR_REASON_ASLEEP: _errors_pb2.ErrorReason
ERROR_REASON_SLEEP_UNAVAILABLE: _errors_pb2.ErrorReason
ERROR_REASON_ADAPTER_REMOVED: _errors_pb2.ErrorReason
ERROR_REASON_UPDATE_IDLE_TIMEOUT: _errors_pb2.ErrorReason
ERROR_REASON_INTERNAL_ERROR: _errors_pb2.ErrorReason
ERROR_REASON_WRONG_WEIGHT_VERSION: _errors_pb2.ErrorReason
ERROR_REASON_DELTA_BASE_MISMATCH: _errors_pb2.ErrorReason
ERROR_REASON_SESSION_NOT_FOUND: _errors_pb2.ErrorReason
ERROR_REASON_SESSION_LOST: _errors_pb2.ErrorReason
ERROR_REASON_SESSION_NOT_OWNED: _errors_pb2.ErrorReason
ERROR_REASON_SESSION_BUSY: _errors_pb2.ErrorReason
ERROR_REASON_SESSION_BUDGET: _errors_pb2.ErrorReason
ERROR_REASON_TEMPLATE_NOT_APPEND_ONLY: _errors_pb2.ErrorReason
ERROR_REASON_CALLER_QUEUE_FULL: _errors_pb2.ErrorReason
ERROR_REASON_VERSION_REUSED: _errors_pb2.ErrorReason
ERROR_REASON_HISTORY_DIVERGED: _errors_pb2.ErrorReason
ERROR_REASON_SHUTTING_DOWN: _errors_pb2.ErrorReason
FINISH_REASON_UNSPECIFIED: _generation_pb2.FinishReason
FINISH_REASON_STOP: _generation_pb2.FinishReason
FINISH_REASON_LENGTH: _generation_pb2.FinishReason
FINISH_REASON_ABORT: _generation_pb2.FinishReason
FINISH_REASON_BUDGET: _generation_pb2.FinishReason
LOGPROBS_MODE_UNSPECIFIED: _server_pb2.LogprobsMode
LOGPROBS_MODE_RAW_LOGPROBS: _server_pb2.LogprobsMode
LOGPROBS_MODE_RAW_LOGITS: _server_pb2.LogprobsMode
LOGPROBS_MODE_PROCESSED_LOGPROBS: _server_pb2.LogprobsMode
LOGPROBS_MODE_PROCESSED_LOGITS: _server_pb2.LogprobsMode
APPEND_RENDER_UNSPECIFIED: _sessions_pb2.AppendRender
APPEND_RENDER_WHOLE: _sessions_pb2.AppendRender
APPEND_RENDER_ISOLATED: _sessions_pb2.AppendRender
HISTORY_RULE_UNSPECIFIED: _sessions_pb2.HistoryRule
HISTORY_RULE_REFUSE: _sessions_pb2.HistoryRule
HISTORY_RULE_RESTART: _sessions_pb2.HistoryRule
TOKEN_SOURCE_UNSPECIFIED: _sessions_pb2.TokenSource
TOKEN_SOURCE_PROMPT: _sessions_pb2.TokenSource
TOKEN_SOURCE_SAMPLED: _sessions_pb2.TokenSource
TOKEN_SOURCE_APPENDED: _sessions_pb2.TokenSource
D_TYPE_UNSPECIFIED: _weights_pb2.DType
D_TYPE_BFLOAT16: _weights_pb2.DType
D_TYPE_FLOAT16: _weights_pb2.DType
D_TYPE_FLOAT32: _weights_pb2.DType
D_TYPE_FLOAT8_E4M3FN: _weights_pb2.DType
D_TYPE_FLOAT8_E5M2: _weights_pb2.DType
D_TYPE_INT8: _weights_pb2.DType
D_TYPE_UINT8: _weights_pb2.DType
D_TYPE_INT16: _weights_pb2.DType
D_TYPE_INT32: _weights_pb2.DType
D_TYPE_INT64: _weights_pb2.DType
D_TYPE_BOOL: _weights_pb2.DType
D_TYPE_FLOAT64: _weights_pb2.DType
TENSOR_ENCODING_UNSPECIFIED: _weights_pb2.TensorEncoding
TENSOR_ENCODING_RAW: _weights_pb2.TensorEncoding
TENSOR_ENCODING_SPARSE_XOR16: _weights_pb2.TensorEncoding
TENSOR_ENCODING_SPARSE_XOR16_ZSTD: _weights_pb2.TensorEncoding
TENSOR_ENCODING_SPARSE_XOR8: _weights_pb2.TensorEncoding
PAUSE_MODE_UNSPECIFIED: _weights_pb2.PauseMode
PAUSE_MODE_WAIT: _weights_pb2.PauseMode
PAUSE_MODE_ABORT: _weights_pb2.PauseMode
PAUSE_MODE_KEEP: _weights_pb2.PauseMode
ADAPTER_ACTION_UNSPECIFIED: _weights_pb2.AdapterAction
ADAPTER_ACTION_LOAD: _weights_pb2.AdapterAction
ADAPTER_ACTION_REMOVE: _weights_pb2.AdapterAction
CACHE_KIND_UNSPECIFIED: _weights_pb2.CacheKind
CACHE_KIND_PREFIX: _weights_pb2.CacheKind
CACHE_KIND_MULTIMODAL: _weights_pb2.CacheKind
CACHE_KIND_ENCODER: _weights_pb2.CacheKind
CACHE_KIND_KV_CONNECTOR: _weights_pb2.CacheKind
