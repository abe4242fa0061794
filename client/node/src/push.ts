/**
 * One UpdateWeights stream: begin, the bytes of every tensor in chunks,
 * commit. Where the server takes TensorChunkBatch
 * (GetServerInfo.accepts_chunk_batches), chunks much smaller than the chunk
 * size travel several to a message, by the Python client's rule
 * (rollout_client/weights/push.py): runs of chunks under a quarter of the chunk size
 * together, up to half of it and 1024 chunks (gRPC costs as much per message
 * as a few hundred KB take to move).
 */

import type * as grpc from "@grpc/grpc-js";

import { RolloutError } from "./errors";
import type { RolloutServiceClient } from "./gen/rollout/v1/RolloutService";
import type { TensorChunk } from "./gen/rollout/v1/TensorChunk";
import type { UpdateWeightsBegin } from "./gen/rollout/v1/UpdateWeightsBegin";
import type { UpdateWeightsRequest } from "./gen/rollout/v1/UpdateWeightsRequest";
import type { UpdateWeightsResponse__Output } from "./gen/rollout/v1/UpdateWeightsResponse";

/** What one TensorChunkBatch may hold (rollout.proto). */
export const MAX_BATCH_CHUNKS = 1024;

/** One chunk: tensor index, offset and length of its bytes. */
export type Piece = [index: number, offset: number, length: number];

/** What one stream carries: the begin message and the bytes that travel for
 * each of its tensors (the encoded bytes of an encoded tensor). */
export interface Outgoing {
  begin: UpdateWeightsBegin;
  data: Uint8Array[];
}

export interface SendOptions {
  chunkBytes: number;
  /** The server takes TensorChunkBatch. */
  batches: boolean;
  deadline: Date;
  onProgress?: (sentBytes: number, totalBytes: number) => void;
}

/** Every chunk of `sizes` (bytes per tensor, in order), `chunkBytes` at most each. */
export function* pieces(sizes: readonly number[], chunkBytes: number): Generator<Piece> {
  for (let i = 0; i < sizes.length; i++) {
    for (let offset = 0; offset < sizes[i]; offset += chunkBytes) {
      yield [i, offset, Math.min(chunkBytes, sizes[i] - offset)];
    }
  }
}

/** The chunks as messages: each alone, or, with `batches`, small ones together (above). */
export function* messages(
  sizes: readonly number[],
  chunkBytes: number,
  batches: boolean,
): Generator<Piece[]> {
  const small = Math.floor(chunkBytes / 4);
  const budget = Math.floor(chunkBytes / 2);
  let group: Piece[] = [];
  let size = 0;
  for (const p of pieces(sizes, chunkBytes)) {
    const n = p[2];
    if (!batches || n >= small) {
      if (group.length) yield group;
      group = [];
      size = 0;
      yield [p];
      continue;
    }
    if (group.length && (size + n > budget || group.length === MAX_BATCH_CHUNKS)) {
      yield group;
      group = [];
      size = 0;
    }
    group.push(p);
    size += n;
  }
  if (group.length) yield group;
}

/** Sends `out` on one UpdateWeights stream; resolves with the acknowledgement. */
export function sendUpdate(
  stub: RolloutServiceClient,
  out: Outgoing,
  opts: SendOptions,
): Promise<UpdateWeightsResponse__Output> {
  const sizes = out.data.map((d) => d.byteLength);
  const total = sizes.reduce((a, b) => a + b, 0);
  return new Promise((resolve, reject) => {
    let settled = false;
    let onSettled: () => void = () => {};
    const call: grpc.ClientWritableStream<UpdateWeightsRequest> = stub.UpdateWeights(
      { deadline: opts.deadline },
      (err, res) => {
        settled = true;
        onSettled();
        if (err) reject(RolloutError.wrap(err));
        else resolve(res!);
      },
    );
    // Waits for the transport to drain, or for the call to end (an early
    // error from the server), whichever comes first.
    const drained = () =>
      new Promise<void>((res) => {
        const done = () => {
          call.off("drain", done);
          onSettled = () => {};
          res();
        };
        call.once("drain", done);
        onSettled = done;
      });
    const write = async (msg: UpdateWeightsRequest) => {
      if (!call.write(msg)) await drained();
    };
    const chunk = ([index, offset, n]: Piece): TensorChunk => ({
      tensor_index: index,
      offset,
      data: out.data[index].subarray(offset, offset + n),
    });

    (async () => {
      await write({ begin: out.begin });
      let sent = 0;
      for (const group of messages(sizes, opts.chunkBytes, opts.batches)) {
        if (settled) return; // the server already answered (an error)
        await write(group.length === 1 ? { chunk: chunk(group[0]) } : { chunks: { chunks: group.map(chunk) } });
        for (const p of group) {
          sent += p[2];
          opts.onProgress?.(sent, total);
        }
      }
      if (settled) return;
      await write({ commit: {} });
      call.end();
    })().catch((e) => {
      if (!settled) {
        settled = true;
        call.cancel();
        reject(e instanceof RolloutError ? e : RolloutError.wrap(e));
      }
    });
  });
}
