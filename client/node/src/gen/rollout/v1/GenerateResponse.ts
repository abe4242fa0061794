// Original file: ../../proto/rollout/v1/rollout.proto

import type { Completion as _rollout_v1_Completion, Completion__Output as _rollout_v1_Completion__Output } from '../../rollout/v1/Completion';
import type { Usage as _rollout_v1_Usage, Usage__Output as _rollout_v1_Usage__Output } from '../../rollout/v1/Usage';

export interface GenerateResponse {
  'request_id'?: (string);
  'completions'?: (_rollout_v1_Completion)[];
  'weight_version'?: (string);
  'usage'?: (_rollout_v1_Usage | null);
}

export interface GenerateResponse__Output {
  'request_id': (string);
  'completions': (_rollout_v1_Completion__Output)[];
  'weight_version': (string);
  'usage': (_rollout_v1_Usage__Output | null);
}
