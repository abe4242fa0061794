import type * as grpc from '@grpc/grpc-js';
import type { EnumTypeDefinition, MessageTypeDefinition } from '@grpc/proto-loader';

import type { CacheResetResult as _rollout_v1_CacheResetResult, CacheResetResult__Output as _rollout_v1_CacheResetResult__Output } from './rollout/v1/CacheResetResult';
import type { Completion as _rollout_v1_Completion, Completion__Output as _rollout_v1_Completion__Output } from './rollout/v1/Completion';
import type { GenerateRequest as _rollout_v1_GenerateRequest, GenerateRequest__Output as _rollout_v1_GenerateRequest__Output } from './rollout/v1/GenerateRequest';
import type { GenerateResponse as _rollout_v1_GenerateResponse, GenerateResponse__Output as _rollout_v1_GenerateResponse__Output } from './rollout/v1/GenerateResponse';
import type { GenerateStreamRequest as _rollout_v1_GenerateStreamRequest, GenerateStreamRequest__Output as _rollout_v1_GenerateStreamRequest__Output } from './rollout/v1/GenerateStreamRequest';
import type { GenerateStreamResponse as _rollout_v1_GenerateStreamResponse, GenerateStreamResponse__Output as _rollout_v1_GenerateStreamResponse__Output } from './rollout/v1/GenerateStreamResponse';
import type { GetServerInfoRequest as _rollout_v1_GetServerInfoRequest, GetServerInfoRequest__Output as _rollout_v1_GetServerInfoRequest__Output } from './rollout/v1/GetServerInfoRequest';
import type { GetServerInfoResponse as _rollout_v1_GetServerInfoResponse, GetServerInfoResponse__Output as _rollout_v1_GetServerInfoResponse__Output } from './rollout/v1/GetServerInfoResponse';
import type { Image as _rollout_v1_Image, Image__Output as _rollout_v1_Image__Output } from './rollout/v1/Image';
import type { ResetCachesRequest as _rollout_v1_ResetCachesRequest, ResetCachesRequest__Output as _rollout_v1_ResetCachesRequest__Output } from './rollout/v1/ResetCachesRequest';
import type { ResetCachesResponse as _rollout_v1_ResetCachesResponse, ResetCachesResponse__Output as _rollout_v1_ResetCachesResponse__Output } from './rollout/v1/ResetCachesResponse';
import type { RolloutServiceClient as _rollout_v1_RolloutServiceClient, RolloutServiceDefinition as _rollout_v1_RolloutServiceDefinition } from './rollout/v1/RolloutService';
import type { SamplingParams as _rollout_v1_SamplingParams, SamplingParams__Output as _rollout_v1_SamplingParams__Output } from './rollout/v1/SamplingParams';
import type { TensorChunk as _rollout_v1_TensorChunk, TensorChunk__Output as _rollout_v1_TensorChunk__Output } from './rollout/v1/TensorChunk';
import type { TensorSpec as _rollout_v1_TensorSpec, TensorSpec__Output as _rollout_v1_TensorSpec__Output } from './rollout/v1/TensorSpec';
import type { TopLogprobs as _rollout_v1_TopLogprobs, TopLogprobs__Output as _rollout_v1_TopLogprobs__Output } from './rollout/v1/TopLogprobs';
import type { UpdateTimings as _rollout_v1_UpdateTimings, UpdateTimings__Output as _rollout_v1_UpdateTimings__Output } from './rollout/v1/UpdateTimings';
import type { UpdateWeightsBegin as _rollout_v1_UpdateWeightsBegin, UpdateWeightsBegin__Output as _rollout_v1_UpdateWeightsBegin__Output } from './rollout/v1/UpdateWeightsBegin';
import type { UpdateWeightsCommit as _rollout_v1_UpdateWeightsCommit, UpdateWeightsCommit__Output as _rollout_v1_UpdateWeightsCommit__Output } from './rollout/v1/UpdateWeightsCommit';
import type { UpdateWeightsRequest as _rollout_v1_UpdateWeightsRequest, UpdateWeightsRequest__Output as _rollout_v1_UpdateWeightsRequest__Output } from './rollout/v1/UpdateWeightsRequest';
import type { UpdateWeightsResponse as _rollout_v1_UpdateWeightsResponse, UpdateWeightsResponse__Output as _rollout_v1_UpdateWeightsResponse__Output } from './rollout/v1/UpdateWeightsResponse';
import type { Usage as _rollout_v1_Usage, Usage__Output as _rollout_v1_Usage__Output } from './rollout/v1/Usage';

type SubtypeConstructor<Constructor extends new (...args: any) => any, Subtype> = {
  new(...args: ConstructorParameters<Constructor>): Subtype;
};

export interface ProtoGrpcType {
  rollout: {
    v1: {
      CacheKind: EnumTypeDefinition
      CacheResetResult: MessageTypeDefinition<_rollout_v1_CacheResetResult, _rollout_v1_CacheResetResult__Output>
      Completion: MessageTypeDefinition<_rollout_v1_Completion, _rollout_v1_Completion__Output>
      DType: EnumTypeDefinition
      FinishReason: EnumTypeDefinition
      GenerateRequest: MessageTypeDefinition<_rollout_v1_GenerateRequest, _rollout_v1_GenerateRequest__Output>
      GenerateResponse: MessageTypeDefinition<_rollout_v1_GenerateResponse, _rollout_v1_GenerateResponse__Output>
      GenerateStreamRequest: MessageTypeDefinition<_rollout_v1_GenerateStreamRequest, _rollout_v1_GenerateStreamRequest__Output>
      GenerateStreamResponse: MessageTypeDefinition<_rollout_v1_GenerateStreamResponse, _rollout_v1_GenerateStreamResponse__Output>
      GetServerInfoRequest: MessageTypeDefinition<_rollout_v1_GetServerInfoRequest, _rollout_v1_GetServerInfoRequest__Output>
      GetServerInfoResponse: MessageTypeDefinition<_rollout_v1_GetServerInfoResponse, _rollout_v1_GetServerInfoResponse__Output>
      Image: MessageTypeDefinition<_rollout_v1_Image, _rollout_v1_Image__Output>
      PauseMode: EnumTypeDefinition
      ResetCachesRequest: MessageTypeDefinition<_rollout_v1_ResetCachesRequest, _rollout_v1_ResetCachesRequest__Output>
      ResetCachesResponse: MessageTypeDefinition<_rollout_v1_ResetCachesResponse, _rollout_v1_ResetCachesResponse__Output>
      RolloutService: SubtypeConstructor<typeof grpc.Client, _rollout_v1_RolloutServiceClient> & { service: _rollout_v1_RolloutServiceDefinition }
      SamplingParams: MessageTypeDefinition<_rollout_v1_SamplingParams, _rollout_v1_SamplingParams__Output>
      TensorChunk: MessageTypeDefinition<_rollout_v1_TensorChunk, _rollout_v1_TensorChunk__Output>
      TensorSpec: MessageTypeDefinition<_rollout_v1_TensorSpec, _rollout_v1_TensorSpec__Output>
      TopLogprobs: MessageTypeDefinition<_rollout_v1_TopLogprobs, _rollout_v1_TopLogprobs__Output>
      UpdateTimings: MessageTypeDefinition<_rollout_v1_UpdateTimings, _rollout_v1_UpdateTimings__Output>
      UpdateWeightsBegin: MessageTypeDefinition<_rollout_v1_UpdateWeightsBegin, _rollout_v1_UpdateWeightsBegin__Output>
      UpdateWeightsCommit: MessageTypeDefinition<_rollout_v1_UpdateWeightsCommit, _rollout_v1_UpdateWeightsCommit__Output>
      UpdateWeightsRequest: MessageTypeDefinition<_rollout_v1_UpdateWeightsRequest, _rollout_v1_UpdateWeightsRequest__Output>
      UpdateWeightsResponse: MessageTypeDefinition<_rollout_v1_UpdateWeightsResponse, _rollout_v1_UpdateWeightsResponse__Output>
      Usage: MessageTypeDefinition<_rollout_v1_Usage, _rollout_v1_Usage__Output>
    }
  }
}

