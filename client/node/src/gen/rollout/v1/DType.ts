// Original file: ../../proto/rollout/v1/rollout.proto

export const DType = {
  D_TYPE_UNSPECIFIED: 'D_TYPE_UNSPECIFIED',
  D_TYPE_BFLOAT16: 'D_TYPE_BFLOAT16',
  D_TYPE_FLOAT16: 'D_TYPE_FLOAT16',
  D_TYPE_FLOAT32: 'D_TYPE_FLOAT32',
  D_TYPE_FLOAT8_E4M3FN: 'D_TYPE_FLOAT8_E4M3FN',
  D_TYPE_FLOAT8_E5M2: 'D_TYPE_FLOAT8_E5M2',
} as const;

export type DType =
  | 'D_TYPE_UNSPECIFIED'
  | 0
  | 'D_TYPE_BFLOAT16'
  | 1
  | 'D_TYPE_FLOAT16'
  | 2
  | 'D_TYPE_FLOAT32'
  | 3
  | 'D_TYPE_FLOAT8_E4M3FN'
  | 4
  | 'D_TYPE_FLOAT8_E5M2'
  | 5

export type DType__Output = typeof DType[keyof typeof DType]
