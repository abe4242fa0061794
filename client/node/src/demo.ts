#!/usr/bin/env node
/**
 * End-to-end demo of the Node client against a running rollout-service,
 * installed with the package as the `rollout-node-demo` command:
 *
 *     rollout-node-demo --target 127.0.0.1:50051 [--version node-demo-1]
 *     ROLLOUT_TOKEN=... rollout-node-demo --target HOST:PORT --tls-ca ca.pem \
 *         [--tls-cert client.pem --tls-key client-key.pem]
 *
 * (a) prints the server info, (b) generates greedily, (c) pushes random bf16
 * weights for lm_head.weight as --version, (d) generates again (unary and
 * streaming) and checks the new version tags every token, (e) resets the
 * caches, (f) checks that a bad request fails with INVALID_ARGUMENT. The last
 * line of stdout is a JSON summary; any failure exits non-zero.
 */

import * as fs from "node:fs";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";

import { RolloutClient, RolloutError, type GenerateRequest, type Usage__Output } from "./client";

const HELP = `usage: rollout-node-demo --target HOST:PORT [options]
       (from a checkout: node dist/demo.js ...)

  --target HOST:PORT   server address (default 127.0.0.1:50051)
  --token TOKEN        bearer token, sent as "authorization: Bearer TOKEN"
                       (default: $ROLLOUT_TOKEN, which keeps it out of \`ps\`);
                       the weight update and the cache reset need an admin token
  --tls-ca FILE        PEM CA of the server's certificate: connect with TLS
  --tls-cert FILE      PEM client certificate, for mutual TLS (with --tls-key)
  --tls-key FILE       PEM private key of --tls-cert
  --retries N          retries of a call failing with UNAVAILABLE (default 3)
  --version V          weight version to push (default node-demo-<time>)
  --tensor NAME        manifest tensor to replace (default lm_head.weight)
  --chunk-bytes N      TensorChunk size (default 32768, to stream several chunks)
  --seed N             seed of the random weights (default 1)
  --timeout-ms N       deadline of every call (default 120000)
  --wait-ms N          how long to wait for SERVING (default 300000)`;

class DemoFailure extends Error {}

function check(cond: boolean, what: string): void {
  if (!cond) throw new DemoFailure(`check failed: ${what}`);
}

/** mulberry32: a small seeded PRNG, uniform in [0, 1). */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** `elements` bf16 values ~ N(0, std), little-endian: the upper 16 bits of each float32. */
function randomBf16(elements: number, seed: number, std = 0.08): Buffer {
  const rand = prng(seed);
  const f32 = new Float32Array(1);
  const u32 = new Uint32Array(f32.buffer);
  const out = Buffer.alloc(elements * 2);
  for (let i = 0; i < elements; i++) {
    // Box-Muller
    const u = 1 - rand();
    const v = rand();
    f32[0] = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v) * std;
    out.writeUInt16LE(u32[0] >>> 16, 2 * i);
  }
  return out;
}

function fmt(xs: number[], digits = 4): string {
  return `[${xs.map((x) => x.toFixed(digits)).join(", ")}]`;
}

function intArg(value: string | undefined, name: string, dflt: number, min = 1): number {
  if (value === undefined) return dflt;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new DemoFailure(`--${name} must be an integer >= ${min}`);
  }
  return n;
}

function readPem(file: string | undefined, flag: string): Buffer | undefined {
  if (file === undefined) return undefined;
  try {
    return fs.readFileSync(file);
  } catch (e) {
    throw new DemoFailure(`--${flag} ${file}: ${(e as Error).message}`);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      target: { type: "string", default: "127.0.0.1:50051" },
      version: { type: "string" },
      tensor: { type: "string", default: "lm_head.weight" },
      "chunk-bytes": { type: "string" },
      seed: { type: "string" },
      "timeout-ms": { type: "string" },
      "wait-ms": { type: "string" },
      token: { type: "string" },
      "tls-ca": { type: "string" },
      "tls-cert": { type: "string" },
      "tls-key": { type: "string" },
      retries: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help) {
    console.log(HELP);
    return;
  }
  const target = values.target!;
  const version = values.version ?? `node-demo-${Date.now()}`;
  const chunkBytes = intArg(values["chunk-bytes"], "chunk-bytes", 32 * 1024);
  const seed = intArg(values.seed, "seed", 1);
  const timeoutMs = intArg(values["timeout-ms"], "timeout-ms", 120_000);
  const waitMs = intArg(values["wait-ms"], "wait-ms", 300_000);
  const retries = intArg(values.retries, "retries", 3, 0);
  if ((values["tls-cert"] === undefined) !== (values["tls-key"] === undefined)) {
    throw new DemoFailure("--tls-cert and --tls-key go together");
  }
  if (values["tls-cert"] !== undefined && values["tls-ca"] === undefined) {
    throw new DemoFailure("--tls-cert needs --tls-ca");
  }
  const token = values.token ?? (process.env.ROLLOUT_TOKEN || undefined);

  const client = new RolloutClient(target, {
    timeoutMs,
    retries,
    token,
    rootCertificates: readPem(values["tls-ca"], "tls-ca"),
    certificateChain: readPem(values["tls-cert"], "tls-cert"),
    privateKey: readPem(values["tls-key"], "tls-key"),
  });
  try {
    await client.waitUntilReady(waitMs);

    // (a) server info
    const info = await client.serverInfo();
    console.log(`[info] model=${info.model} server_version=${info.server_version}`);
    console.log(
      `[info] weight_version=${info.weight_version} vocab_size=${info.vocab_size} ` +
        `max_model_len=${info.max_model_len} parameters=${info.parameters.length} ` +
        `max_message_bytes=${info.max_message_bytes} ` +
        `recommended_chunk_bytes=${info.recommended_chunk_bytes} ` +
        `max_update_bytes=${info.max_update_bytes} degraded=${info.degraded}`,
    );
    check(info.parameters.length > 0, "the manifest lists parameters");
    check(chunkBytes < info.max_message_bytes, "chunk size is below the server's message limit");

    // (b) greedy generation
    const request: GenerateRequest = {
      prompt_text: "Hello from Node",
      sampling_params: { max_tokens: 8, temperature: 0 },
    };
    const before = await client.generate(request);
    const b = before.completions[0];
    console.log(`[before] weight_version=${before.weight_version} finish=${b.finish_reason}`);
    console.log(`[before] token_ids=${JSON.stringify(b.token_ids)}`);
    console.log(`[before] logprobs=${fmt(b.logprobs)}`);
    check(before.completions.length === 1, "one completion");
    check(b.token_ids.length > 0 && b.token_ids.length <= 8, "1..8 tokens");
    check(b.logprobs.length === b.token_ids.length, "one logprob per token");
    check(before.weight_version !== "", "a weight version");
    check(before.weight_version !== version, `the server does not already serve ${version}`);

    // (c) weight update of one manifest tensor
    const spec = info.parameters.find((p) => p.name === values.tensor);
    if (spec === undefined) throw new DemoFailure(`${values.tensor} is not in the manifest`);
    check(spec.dtype === "D_TYPE_BFLOAT16", `${spec.name} is bf16 (got ${spec.dtype})`);
    const elements = spec.shape.reduce((n, d) => n * d, 1);
    const data = randomBf16(elements, seed);
    console.log(
      `[update] ${spec.name} shape=${JSON.stringify(spec.shape)} bytes=${data.length} ` +
        `chunk_bytes=${chunkBytes} version=${version}`,
    );
    let chunks = 0;
    const ack = await client.updateWeights(
      version,
      [{ name: spec.name, dtype: spec.dtype, shape: spec.shape, data }],
      { pauseMode: "PAUSE_MODE_WAIT", chunkBytes, checksum: true, onProgress: () => chunks++ },
    );
    console.log(`[update] ack=${JSON.stringify(ack)}`);
    check(ack.weight_version === version, "ack.weight_version is the new version");
    check(ack.bytes_received === data.length, "every byte was received");
    check(ack.tensors_loaded === 1, "one tensor loaded");
    check(chunks === Math.ceil(data.length / chunkBytes), "every chunk was sent");

    // (d) generate again: the new version tags every token
    const after = await client.generate(request);
    const a = after.completions[0];
    console.log(`[after] weight_version=${after.weight_version} finish=${a.finish_reason}`);
    console.log(`[after] token_ids=${JSON.stringify(a.token_ids)}`);
    console.log(`[after] logprobs=${fmt(a.logprobs)}`);
    check(after.weight_version === version, `generation reports ${version}`);
    const changed = JSON.stringify(a.token_ids) !== JSON.stringify(b.token_ids);
    console.log(`[after] tokens ${changed ? "differ from" : "are the same as"} before the update`);

    const streamed: number[] = [];
    const streamVersions = new Set<string>();
    let usage: Usage__Output | null = null;
    for await (const delta of client.generateStream(request)) {
      streamed.push(...delta.token_ids);
      streamVersions.add(delta.weight_version);
      if (delta.usage) usage = delta.usage;
    }
    console.log(
      `[stream] token_ids=${JSON.stringify(streamed)} versions=${JSON.stringify([...streamVersions])} ` +
        `usage=${JSON.stringify(usage)}`,
    );
    check(streamVersions.size === 1 && streamVersions.has(version), `every delta reports ${version}`);
    check(usage !== null, "the last delta carries the usage");
    console.log(
      `[stream] tokens ${JSON.stringify(streamed) === JSON.stringify(a.token_ids) ? "match" : "differ from"} the unary call`,
    );

    // (e) reset caches
    const reset = await client.resetCaches();
    for (const r of reset.results) {
      console.log(`[reset] ${r.cache} reset=${r.reset}${r.detail ? ` detail=${r.detail}` : ""}`);
    }
    console.log(`[reset] duration_seconds=${reset.duration_seconds.toFixed(3)}`);
    check(reset.results.length === 3, "one result per cache");
    check(reset.results.every((r) => r.reset), "every cache was reset");

    // (f) errors carry the gRPC status code and the server's message
    try {
      await client.generate({ prompt_text: "x", sampling_params: { top_p: 1.5 } });
      throw new DemoFailure("top_p=1.5 was accepted");
    } catch (e) {
      if (!(e instanceof RolloutError)) throw e;
      console.log(`[error] ${e.message}`);
      check(e.code === grpc.status.INVALID_ARGUMENT, "INVALID_ARGUMENT for top_p=1.5");
      check(e.details.includes("top_p"), "the message names the field");
    }

    const finalInfo = await client.serverInfo();
    check(finalInfo.weight_version === version, `the server serves ${version}`);

    console.log(
      JSON.stringify({
        ok: true,
        version,
        previous_version: before.weight_version,
        tokens_before: b.token_ids,
        tokens_after: a.token_ids,
        tokens_changed: changed,
        bytes_sent: data.length,
        chunks,
      }),
    );
  } finally {
    client.close();
  }
}

main().catch((e: unknown) => {
  if (e instanceof RolloutError) {
    console.error(`demo failed: RPC error ${e.message}${e.reason ? ` (reason ${e.reason})` : ""}`);
  }
  else if (e instanceof DemoFailure) console.error(`demo failed: ${e.message}`);
  else console.error("demo failed:", e);
  process.exitCode = 1;
});
