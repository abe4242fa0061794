// Original file: ../../proto/rollout/v1/rollout.proto

import type { TopLogprobs as _rollout_v1_TopLogprobs, TopLogprobs__Output as _rollout_v1_TopLogprobs__Output } from '../../rollout/v1/TopLogprobs';
import type { FinishReason as _rollout_v1_FinishReason, FinishReason__Output as _rollout_v1_FinishReason__Output } from '../../rollout/v1/FinishReason';
import type { Usage as _rollout_v1_Usage, Usage__Output as _rollout_v1_Usage__Output } from '../../rollout/v1/Usage';

export interface GenerateStreamResponse {
  'request_id'?: (string);
  'index'?: (number);
  'token_ids'?: (number)[];
  'logprobs'?: (number | string)[];
  'top_logprobs'?: (_rollout_v1_TopLogprobs)[];
  'text'?: (string);
  'finish_reason'?: (_rollout_v1_FinishReason);
  'weight_version'?: (string);
  'usage'?: (_rollout_v1_Usage | null);
  'stop_reason'?: (string);
}

export interface GenerateStreamResponse__Output {
  'request_id': (string);
  'index': (number);
  'token_ids': (number)[];
  'logprobs': (number)[];
  'top_logprobs': (_rollout_v1_TopLogprobs__Output)[];
  'text': (string);
  'finish_reason': (_rollout_v1_FinishReason__Output);
  'weight_version': (string);
  'usage': (_rollout_v1_Usage__Output | null);
  'stop_reason': (string);
}
