// Original file: ../../proto/rollout/v1/rollout.proto

import type { CacheKind as _rollout_v1_CacheKind, CacheKind__Output as _rollout_v1_CacheKind__Output } from '../../rollout/v1/CacheKind';

export interface CacheResetResult {
  'cache'?: (_rollout_v1_CacheKind);
  'reset'?: (boolean);
  'detail'?: (string);
}

export interface CacheResetResult__Output {
  'cache': (_rollout_v1_CacheKind__Output);
  'reset': (boolean);
  'detail': (string);
}
