// Original file: ../../proto/rollout/v1/rollout.proto

export const FinishReason = {
  FINISH_REASON_UNSPECIFIED: 'FINISH_REASON_UNSPECIFIED',
  FINISH_REASON_STOP: 'FINISH_REASON_STOP',
  FINISH_REASON_LENGTH: 'FINISH_REASON_LENGTH',
  FINISH_REASON_ABORT: 'FINISH_REASON_ABORT',
} as const;

export type FinishReason =
  | 'FINISH_REASON_UNSPECIFIED'
  | 0
  | 'FINISH_REASON_STOP'
  | 1
  | 'FINISH_REASON_LENGTH'
  | 2
  | 'FINISH_REASON_ABORT'
  | 3

export type FinishReason__Output = typeof FinishReason[keyof typeof FinishReason]
