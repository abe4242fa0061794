/**
 * TypeScript client for rollout.v1.RolloutService.
 *
 * The service definition is loaded at run time with @grpc/proto-loader from
 * the package's own copy of rollout.proto (`proto/rollout/v1/rollout.proto`
 * inside the package, copied from the repository's proto/ by `npm run build`
 * and shipped by `npm pack`); the TypeScript types under src/gen/ are
 * generated from the same file at build time.
 *
 *     const client = new RolloutClient("127.0.0.1:50051", {
 *       token: process.env.ROLLOUT_TOKEN,                 // authorization: Bearer <token>
 *       rootCertificates: fs.readFileSync("ca.pem"),     // TLS
 *       certificateChain: fs.readFileSync("client.pem"), // mutual TLS, with privateKey
 *       privateKey: fs.readFileSync("client-key.pem"),
 *     });
 *     await client.waitUntilReady(120_000);
 *     const r = await client.generate({
 *       prompt_text: "Hello",
 *       sampling_params: { max_tokens: 8, temperature: 0 },
 *     });
 *     console.log(r.weight_version, r.completions[0].token_ids);
 *     const ack = await client.updateWeights("step-1", [
 *       { name: "lm_head.weight", dtype: "D_TYPE_BFLOAT16", shape: [512, 128], data },
 *     ]);
 *     client.close();
 *
 * Every call has a deadline (`timeoutMs`, per client and per call). Failed
 * calls reject with a RolloutError carrying the gRPC status code and the
 * server's message. Retries follow the Python client: unary calls
 * (GetServerInfo, Generate, ResetCaches, GetSession) failing with UNAVAILABLE are retried
 * `retries` times with exponential backoff, by gRPC's own retry policy (the
 * channel's service config); UpdateWeights is retried as a whole stream,
 * which the server makes safe (the same version and bytes get the original
 * acknowledgement back, with `replayed` set); GenerateStream is not retried.
 * Sessions (openSession, sessions.ts) go through the same channel.
 */

import * as fs from "node:fs";
import * as path from "node:path";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { Caller, type CallOpts } from "./calls";
import { RolloutError } from "./errors";
import type { ProtoGrpcType } from "./gen/rollout";
import type { GenerateRequest } from "./gen/rollout/v1/GenerateRequest";
import type { GenerateResponse__Output } from "./gen/rollout/v1/GenerateResponse";
import type { GenerateStreamRequest } from "./gen/rollout/v1/GenerateStreamRequest";
import type { GenerateStreamResponse__Output } from "./gen/rollout/v1/GenerateStreamResponse";
import type { GetServerInfoResponse__Output } from "./gen/rollout/v1/GetServerInfoResponse";
import type { PauseMode } from "./gen/rollout/v1/PauseMode";
import type { ResetCachesResponse__Output } from "./gen/rollout/v1/ResetCachesResponse";
import type { RolloutServiceClient } from "./gen/rollout/v1/RolloutService";
import type { UpdateWeightsBegin } from "./gen/rollout/v1/UpdateWeightsBegin";
import type { UpdateWeightsResponse__Output } from "./gen/rollout/v1/UpdateWeightsResponse";
import { type Outgoing, sendUpdate } from "./push";
import { type Delta, PushedWeights, type PushRecord } from "./pushed";
import { openSession, type OpenSessionInput, type Session } from "./sessions";
import { tensorSpec, type WeightTensor } from "./tensors";

export type { CallOpts } from "./calls";
export { errorReason, RolloutError } from "./errors";
export * from "./sessions";
export { applySparseXor8, encodeSparseXor8, sparseXor8Bound } from "./delta";
export { messages as chunkMessages, MAX_BATCH_CHUNKS } from "./push";
export { PushedWeights, type PushRecord } from "./pushed";
export { crc32c, DTYPE_SIZE, tensorSpec, type WeightTensor } from "./tensors";

export type * from "./gen/rollout/v1/CacheResetResult";
export type * from "./gen/rollout/v1/Completion";
export type * from "./gen/rollout/v1/GenerateRequest";
export type * from "./gen/rollout/v1/GenerateResponse";
export type * from "./gen/rollout/v1/GenerateStreamRequest";
export type * from "./gen/rollout/v1/GenerateStreamResponse";
export type * from "./gen/rollout/v1/GetServerInfoResponse";
export type * from "./gen/rollout/v1/ResetCachesResponse";
export type * from "./gen/rollout/v1/SamplingParams";
export type * from "./gen/rollout/v1/TensorSpec";
export type * from "./gen/rollout/v1/TopLogprobs";
export type * from "./gen/rollout/v1/UpdateTimings";
export type * from "./gen/rollout/v1/UpdateWeightsResponse";
export type * from "./gen/rollout/v1/Usage";
export type { DType, DType__Output } from "./gen/rollout/v1/DType";
export type { PauseMode, PauseMode__Output } from "./gen/rollout/v1/PauseMode";
export type { FinishReason, FinishReason__Output } from "./gen/rollout/v1/FinishReason";
export type { CacheKind, CacheKind__Output } from "./gen/rollout/v1/CacheKind";

/** Largest message sent or received; the server's default limit is also 64 MiB. */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** TensorChunk.data size; the server recommends 1 MiB (GetServerInfo.recommended_chunk_bytes). */
export const DEFAULT_CHUNK_BYTES = 1024 * 1024;
/** Default deadline of every call. */
export const DEFAULT_TIMEOUT_MS = 600_000;

/** Default number of retries of a call that fails with UNAVAILABLE (the Python client's). */
export const DEFAULT_RETRIES = 3;
/** Default backoff before the first retry, doubled before each next one (the Python client's). */
export const DEFAULT_BACKOFF_MS = 500;

/** The package root, from dist/ or src/. */
const PACKAGE_ROOT = path.resolve(__dirname, "..");
/** The package's own copy of the proto tree (copied from the repository's proto/ at build time). */
export const PROTO_ROOT = path.join(PACKAGE_ROOT, "proto");
/** rollout.proto inside the package. */
export const DEFAULT_PROTO_PATH = path.join(PROTO_ROOT, "rollout", "v1", "rollout.proto");

const SERVICE = "rollout.v1.RolloutService";
/**
 * The unary RPCs this client calls that are safe to send twice, retried by
 * the service config's retryPolicy (the Python client's list). The other
 * session calls are not: a second OpenSession opens a second session, a
 * second SessionGenerate or AppendToSession adds to the trajectory again, and
 * a CloseSession that did close answers its retry SESSION_NOT_FOUND.
 */
const RETRIED_METHODS = ["GetServerInfo", "Generate", "ResetCaches", "GetSession"];
/** grpc-js caps retryPolicy.maxAttempts at 5 unless this channel option raises it. */
const MAX_ATTEMPTS_LIMIT_OPTION = "grpc-node.retry_max_attempts_limit";

const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
};

/** grpc.health.v1, inline (protobufjs JSON form of the standard health.proto). */
const HEALTH_JSON = {
  nested: {
    grpc: {
      nested: {
        health: {
          nested: {
            v1: {
              nested: {
                HealthCheckRequest: { fields: { service: { type: "string", id: 1 } } },
                HealthCheckResponse: {
                  fields: { status: { type: "ServingStatus", id: 1 } },
                  nested: {
                    ServingStatus: {
                      values: { UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 },
                    },
                  },
                },
                Health: {
                  methods: {
                    Check: { requestType: "HealthCheckRequest", responseType: "HealthCheckResponse" },
                  },
                },
              },
            },
          },
        },
      },
    },
  },
};

type HealthJson = Parameters<typeof protoLoader.fromJSON>[0];

interface HealthClient extends grpc.Client {
  Check(
    request: { service?: string },
    options: grpc.CallOptions,
    callback: grpc.requestCallback<{ status: string }>,
  ): grpc.ClientUnaryCall;
}

export interface ClientOptions {
  /** Default deadline of every call, in milliseconds. */
  timeoutMs?: number;
  /** grpc.max_send_message_length and grpc.max_receive_message_length. */
  maxMessageBytes?: number;
  /** The rollout.proto to load, in a proto tree with the files it imports
   * (<root>/rollout/v1/); default the copy bundled in the package (DEFAULT_PROTO_PATH). */
  protoPath?: string;
  /** Sent as `authorization: Bearer <token>` metadata on every call (health checks too). */
  token?: string;
  /** Sent as `rollout-tenant` metadata: who the server's fair share counts the
   * calls against when auth is off (with auth on, the token decides). */
  tenant?: string;
  /** PEM CA certificate(s) of the server's certificate: connect with TLS. */
  rootCertificates?: Uint8Array;
  /** PEM client certificate, for mutual TLS (with privateKey). */
  certificateChain?: Uint8Array;
  /** PEM private key of certificateChain. */
  privateKey?: Uint8Array;
  /** Connect with TLS even without rootCertificates (then the system's roots verify the server). */
  tls?: boolean;
  /** Channel credentials to use instead of the TLS options above (default: insecure). */
  credentials?: grpc.ChannelCredentials;
  /** Retries of a call that fails with UNAVAILABLE (default 3; 0: none). */
  retries?: number;
  /** Backoff before the first retry in milliseconds, doubled before each next one (default 500). */
  backoffMs?: number;
  /** Extra channel options, e.g. {"grpc.keepalive_time_ms": 30000}; they override the client's. */
  channelOptions?: grpc.ChannelOptions;
}

/**
 * The channel's service config: a gRPC retryPolicy on the unary RPCs, retrying
 * UNAVAILABLE `retries` times, backing off `backoffMs` and then twice as long
 * each time (gRPC adds +-20% jitter). UpdateWeights is left out (a client
 * stream is retried whole by RolloutClient.updateWeights instead, since gRPC
 * buffers at most grpc.per_rpc_retry_buffer_size bytes of it for a retry) and
 * so is GenerateStream (as in the Python client). No method config with `retries` 0.
 */
export function retryServiceConfig(retries = DEFAULT_RETRIES, backoffMs = DEFAULT_BACKOFF_MS): object {
  checkRetries(retries, backoffMs);
  if (retries === 0) return { methodConfig: [] };
  // gRPC refuses a zero backoff: 1 ms is as good as none.
  const seconds = (ms: number) => `${(Math.max(ms, 1) / 1000).toFixed(6)}s`;
  return {
    methodConfig: [
      {
        name: RETRIED_METHODS.map((method) => ({ service: SERVICE, method })),
        retryPolicy: {
          maxAttempts: retries + 1,
          initialBackoff: seconds(backoffMs),
          maxBackoff: seconds(backoffMs * 2 ** (retries - 1)),
          backoffMultiplier: 2,
          retryableStatusCodes: ["UNAVAILABLE"],
        },
      },
    ],
  };
}

function checkRetries(retries: number, backoffMs: number): void {
  if (!Number.isInteger(retries) || retries < 0) {
    throw new RangeError(`retries must be a non-negative integer, got ${retries}`);
  }
  if (!(backoffMs > 0)) throw new RangeError(`backoffMs must be positive, got ${backoffMs}`);
}

/** The channel credentials `opts` asks for: TLS (mutual with a client certificate) or insecure. */
export function channelCredentials(opts: ClientOptions): grpc.ChannelCredentials {
  if (opts.credentials) return opts.credentials;
  const { rootCertificates, certificateChain, privateKey } = opts;
  if ((certificateChain === undefined) !== (privateKey === undefined)) {
    throw new RangeError("certificateChain and privateKey go together (mutual TLS)");
  }
  if (rootCertificates === undefined && certificateChain === undefined && !opts.tls) {
    return grpc.credentials.createInsecure();
  }
  const buf = (b?: Uint8Array) => (b === undefined ? null : Buffer.from(b));
  return grpc.credentials.createSsl(buf(rootCertificates), buf(privateKey), buf(certificateChain));
}

/** An interceptor that adds `key: value` metadata to every call. */
function metadataInterceptor(key: string, value: string): grpc.Interceptor {
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set(key, value);
        next(metadata, listener);
      },
    });
}

/** An interceptor that adds `authorization: Bearer <token>` to every call. */
export function bearerTokenInterceptor(token: string): grpc.Interceptor {
  return metadataInterceptor("authorization", `Bearer ${token}`);
}

export interface UpdateWeightsOptions extends CallOpts {
  /** What happens to in-flight generations; default PAUSE_MODE_WAIT. */
  pauseMode?: PauseMode;
  /** TensorChunk.data size, default 1 MiB. */
  chunkBytes?: number;
  /** Send TensorSpec.crc32c (CRC-32C of each tensor) for the server to check. */
  checksum?: boolean;
  /** Called after each chunk is handed to the transport. */
  onProgress?: (sentBytes: number, totalBytes: number) => void;
  /** Send a delta against this client's last acknowledged push where the
   * server still serves it (SPARSE_XOR8; RolloutClient.pushed), else a full push. */
  delta?: boolean;
}

export class RolloutClient {
  readonly target: string;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly backoffMs: number;
  private readonly stub: RolloutServiceClient;
  private readonly calls: Caller;
  private readonly health: HealthClient;
  /** What this client last pushed with `delta: true`, and each such push's way and why. */
  pushed?: PushedWeights;
  /** The server takes TensorChunkBatch (its last GetServerInfo answer said so). */
  private acceptsChunkBatches = false;

  constructor(target = "127.0.0.1:50051", opts: ClientOptions = {}) {
    this.target = target;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.retries = opts.retries ?? DEFAULT_RETRIES;
    this.backoffMs = opts.backoffMs ?? DEFAULT_BACKOFF_MS;
    checkRetries(this.retries, this.backoffMs);
    const protoPath = opts.protoPath ?? DEFAULT_PROTO_PATH;
    if (!fs.existsSync(protoPath)) {
      throw new Error(`rollout.proto not found at ${protoPath} (set ClientOptions.protoPath)`);
    }
    const maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    const channelOptions: grpc.ChannelOptions = {
      "grpc.max_send_message_length": maxMessageBytes,
      "grpc.max_receive_message_length": maxMessageBytes,
      "grpc.service_config": JSON.stringify(retryServiceConfig(this.retries, this.backoffMs)),
      [MAX_ATTEMPTS_LIMIT_OPTION]: Math.max(5, this.retries + 1),
      ...opts.channelOptions,
    };
    const credentials = channelCredentials(opts);
    const interceptors = opts.token ? [bearerTokenInterceptor(opts.token)] : [];
    if (opts.tenant) interceptors.push(metadataInterceptor("rollout-tenant", opts.tenant));

    // Imports resolve against the root of the proto tree (buf style:
    // "rollout/v1/..."; rollout.proto imports the files the package is split
    // into): the bundled tree, or the one a protoPath sits in
    // (<root>/rollout/v1/rollout.proto).
    const protoRoot =
      opts.protoPath === undefined ? PROTO_ROOT : path.resolve(path.dirname(protoPath), "..", "..");
    const rollout = grpc.loadPackageDefinition(
      protoLoader.loadSync(protoPath, {
        ...LOADER_OPTIONS,
        includeDirs: [protoRoot],
      }),
    ) as unknown as ProtoGrpcType;
    this.stub = new rollout.rollout.v1.RolloutService(target, credentials, {
      ...channelOptions,
      interceptors,
    });

    // The health client shares the stub's channel.
    const health = grpc.loadPackageDefinition(protoLoader.fromJSON(HEALTH_JSON as HealthJson, LOADER_OPTIONS)) as any;
    this.health = new health.grpc.health.v1.Health(target, credentials, {
      channelOverride: this.stub.getChannel(),
      interceptors,
    }) as HealthClient;
    this.calls = new Caller(this.stub, this.timeoutMs);
  }

  close(): void {
    this.stub.close();
  }

  /** Polls grpc.health.v1 Check until SERVING; rejects with a DEADLINE_EXCEEDED RolloutError. */
  async waitUntilReady(timeoutMs = 300_000): Promise<void> {
    const end = Date.now() + timeoutMs;
    let last = "no answer";
    for (;;) {
      const remaining = end - Date.now();
      try {
        const r = await new Promise<{ status: string }>((resolve, reject) => {
          this.health.Check(
            { service: "" },
            { deadline: new Date(Date.now() + Math.max(100, Math.min(5_000, remaining))) },
            (err, res) => (err ? reject(err) : resolve(res!)),
          );
        });
        if (r.status === "SERVING") return;
        last = r.status;
      } catch (e) {
        last = RolloutError.wrap(e).message;
      }
      if (Date.now() >= end) {
        throw new RolloutError(
          grpc.status.DEADLINE_EXCEEDED,
          `${this.target} not SERVING after ${timeoutMs} ms (last: ${last})`,
        );
      }
      await new Promise((r) => setTimeout(r, Math.min(500, Math.max(0, end - Date.now()))));
    }
  }

  /** Model, weight version, the parameter manifest and the limits. */
  async serverInfo(opts?: CallOpts): Promise<GetServerInfoResponse__Output> {
    const info: GetServerInfoResponse__Output = await this.calls.unary(this.stub.GetServerInfo, {}, opts);
    this.acceptsChunkBatches = info.accepts_chunk_batches;
    return info;
  }

  /** Generates every completion of one prompt. */
  generate(req: GenerateRequest, opts?: CallOpts): Promise<GenerateResponse__Output> {
    return this.calls.unary(this.stub.Generate, req, opts);
  }

  /** Streams token deltas; the last message carries the usage. Leaving the
   * loop early cancels the call. */
  generateStream(
    req: GenerateStreamRequest,
    opts?: CallOpts,
  ): AsyncGenerator<GenerateStreamResponse__Output, void, undefined> {
    return this.calls.serverStream(this.stub.GenerateStream, req, opts);
  }

  /**
   * Opens a session (OpenSessionRequest: exactly one of prompt_token_ids,
   * prompt_text and messages): one multi-turn trajectory the server holds as
   * token ids, so no turn is ever re-tokenized (docs/sessions.md). Its calls
   * go through this client's channel: the same token, TLS and deadlines.
   */
  openSession(req: OpenSessionInput, opts?: CallOpts): Promise<Session> {
    return openSession(this.calls, req, opts);
  }

  /** Atomically resets the prefix/KV, multimodal input and encoder caches. */
  resetCaches(opts?: CallOpts): Promise<ResetCachesResponse__Output> {
    return this.calls.unary(this.stub.ResetCaches, {}, opts);
  }

  /**
   * Streams `tensors` as the weights of `version`: begin (version, specs,
   * pause mode), the chunks of every tensor in order, commit. Resolves with
   * the server's acknowledgement, sent once the weights are loaded and every
   * cache is reset; all or nothing. A stream that fails with UNAVAILABLE is
   * sent again, whole, up to `retries` times with the same backoff as the
   * unary calls (each attempt with its own deadline): if an earlier attempt
   * was applied, the server answers the retry with the original
   * acknowledgement and `replayed` set.
   *
   * Small chunks travel several to a message (TensorChunkBatch) once the
   * client has seen the server take them (any serverInfo() answer; a delta
   * push asks). `delta: true` sends the update as a delta against the last
   * push this client had acknowledged, where the server still serves it
   * (pushed.ts; every push's way and why in `this.pushed.history`).
   */
  async updateWeights(
    version: string,
    tensors: WeightTensor[],
    opts: UpdateWeightsOptions = {},
  ): Promise<UpdateWeightsResponse__Output> {
    const chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES;
    if (!Number.isInteger(chunkBytes) || chunkBytes <= 0) {
      throw new RangeError(`chunkBytes must be a positive integer, got ${chunkBytes}`);
    }
    if (tensors.length === 0) throw new RangeError("updateWeights needs at least one tensor");
    const begin: UpdateWeightsBegin = {
      weight_version: version,
      pause_mode: opts.pauseMode ?? "PAUSE_MODE_WAIT",
    };
    if (opts.delta) return this.updateWeightsDelta(tensors, begin, { ...opts, chunkBytes });
    return this.send(fullUpdate(tensors, begin, opts.checksum), { ...opts, chunkBytes });
  }

  /** updateWeights(delta: true): a delta when the server's base is the last
   * acknowledged push, else (or when the server refuses that base) a full push. */
  private async updateWeightsDelta(
    tensors: WeightTensor[],
    begin: UpdateWeightsBegin,
    opts: UpdateWeightsOptions & { chunkBytes: number },
  ): Promise<UpdateWeightsResponse__Output> {
    const pushed = (this.pushed ??= new PushedWeights());
    const info = await this.serverInfo(opts);
    let why: string;
    if (pushed.version === "") why = "no push of this client acknowledged yet";
    else if (pushed.version !== info.delta_base_version) {
      const base = info.delta_base_version;
      why = `the server's delta base is "${base}", not this client's last push "${pushed.version}"`;
    } else {
      const d = pushed.delta(tensors, begin);
      const started = performance.now();
      try {
        const ack = await this.send(d.outgoing, opts);
        pushed.recordDelta(d, ack.weight_version);
        const why = "the server's delta base is this client's last push";
        pushed.history.push(pushRecord(ack, "delta", why, tensors, d.outgoing, started, d));
        return ack;
      } catch (e) {
        if (!(e instanceof RolloutError) || e.reason !== "DELTA_BASE_MISMATCH") throw e;
        why = `the server refused the delta's base (DELTA_BASE_MISMATCH: ${e.details})`;
      }
    }
    const full = fullUpdate(tensors, begin, opts.checksum);
    const started = performance.now();
    const ack = await this.send(full, opts);
    pushed.recordFull(tensors, ack);
    pushed.history.push(pushRecord(ack, "full", why, tensors, full, started));
    return ack;
  }

  /** One update on one stream, resent whole on UNAVAILABLE (updateWeights). */
  private async send(
    out: Outgoing,
    opts: UpdateWeightsOptions & { chunkBytes: number },
  ): Promise<UpdateWeightsResponse__Output> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await sendUpdate(this.stub, out, {
          chunkBytes: opts.chunkBytes,
          batches: this.acceptsChunkBatches,
          deadline: this.calls.deadline(opts),
          onProgress: opts.onProgress,
        });
      } catch (e) {
        if (!(e instanceof RolloutError) || e.code !== grpc.status.UNAVAILABLE || attempt >= this.retries) {
          throw e;
        }
        await new Promise((r) => setTimeout(r, this.backoffMs * 2 ** attempt));
      }
    }
  }
}

/** `tensors` as they are, every byte on the wire. */
function fullUpdate(tensors: WeightTensor[], begin: UpdateWeightsBegin, checksum = false): Outgoing {
  return {
    begin: { ...begin, tensors: tensors.map((t) => tensorSpec(t, checksum)) },
    data: tensors.map((t) => t.data),
  };
}

/** The PushRecord of an acknowledged push. */
function pushRecord(
  ack: UpdateWeightsResponse__Output,
  way: "delta" | "full",
  why: string,
  tensors: WeightTensor[],
  out: Outgoing,
  started: number,
  d?: Delta,
): PushRecord {
  const count = (f: (e: Delta["tensors"][number]) => boolean) => (d ? d.tensors.filter(f).length : 0);
  return {
    version: ack.weight_version,
    way,
    why,
    modelBytes: tensors.reduce((n, t) => n + t.data.byteLength, 0),
    wireBytes: out.data.reduce((n, x) => n + x.byteLength, 0),
    encodedTensors: count((e) => e.changed && e.sparse !== undefined),
    rawTensors: count((e) => e.changed && e.sparse === undefined),
    unchangedTensors: count((e) => !e.changed),
    encodeMs: d?.encodeMs ?? 0,
    sendMs: performance.now() - started,
  };
}
