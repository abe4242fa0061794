// Original file: ../../proto/rollout/v1/rollout.proto

import type { FinishReason as _rollout_v1_FinishReason, FinishReason__Output as _rollout_v1_FinishReason__Output } from '../../rollout/v1/FinishReason';
import type { TopLogprobs as _rollout_v1_TopLogprobs, TopLogprobs__Output as _rollout_v1_TopLogprobs__Output } from '../../rollout/v1/TopLogprobs';

export interface Completion {
  'index'?: (number);
  'token_ids'?: (number)[];
  'logprobs'?: (number | string)[];
  'finish_reason'?: (_rollout_v1_FinishReason);
  'text'?: (string);
  'top_logprobs'?: (_rollout_v1_TopLogprobs)[];
  'stop_reason'?: (string);
}

export interface Completion__Output {
  'index': (number);
  'token_ids': (number)[];
  'logprobs': (number)[];
  'finish_reason': (_rollout_v1_FinishReason__Output);
  'text': (string);
  'top_logprobs': (_rollout_v1_TopLogprobs__Output)[];
  'stop_reason': (string);
}
