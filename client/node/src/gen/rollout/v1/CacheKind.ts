// Original file: ../../proto/rollout/v1/rollout.proto

export const CacheKind = {
  CACHE_KIND_UNSPECIFIED: 'CACHE_KIND_UNSPECIFIED',
  CACHE_KIND_PREFIX: 'CACHE_KIND_PREFIX',
  CACHE_KIND_MULTIMODAL: 'CACHE_KIND_MULTIMODAL',
  CACHE_KIND_ENCODER: 'CACHE_KIND_ENCODER',
} as const;

export type CacheKind =
  | 'CACHE_KIND_UNSPECIFIED'
  | 0
  | 'CACHE_KIND_PREFIX'
  | 1
  | 'CACHE_KIND_MULTIMODAL'
  | 2
  | 'CACHE_KIND_ENCODER'
  | 3

export type CacheKind__Output = typeof CacheKind[keyof typeof CacheKind]
