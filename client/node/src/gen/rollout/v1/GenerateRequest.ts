// Original file: ../../proto/rollout/v1/rollout.proto

import type { SamplingParams as _rollout_v1_SamplingParams, SamplingParams__Output as _rollout_v1_SamplingParams__Output } from '../../rollout/v1/SamplingParams';
import type { Image as _rollout_v1_Image, Image__Output as _rollout_v1_Image__Output } from '../../rollout/v1/Image';

export interface GenerateRequest {
  'request_id'?: (string);
  'prompt_token_ids'?: (number)[];
  'prompt_text'?: (string);
  'sampling_params'?: (_rollout_v1_SamplingParams | null);
  'images'?: (_rollout_v1_Image)[];
}

export interface GenerateRequest__Output {
  'request_id': (string);
  'prompt_token_ids': (number)[];
  'prompt_text': (string);
  'sampling_params': (_rollout_v1_SamplingParams__Output | null);
  'images': (_rollout_v1_Image__Output)[];
}
