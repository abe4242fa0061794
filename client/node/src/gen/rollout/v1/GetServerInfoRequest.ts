// Original file: ../../proto/rollout/v1/rollout.proto


export interface GetServerInfoRequest {
}

export interface GetServerInfoRequest__Output {
}
