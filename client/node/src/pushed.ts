/**
 * Delta pushes: what a client last pushed and had acknowledged, and a new
 * update as a delta against it (UpdateWeightsBegin.base_version).
 *
 * `PushedWeights` keeps a copy of the bytes of every tensor pushed (the size
 * of the model; `maxBytes` bounds it, and tensors past it are sent raw every
 * time) and the version they make on the server. When the server's
 * GetServerInfo.delta_base_version is that version, the next push sends each
 * tensor as SPARSE_XOR8 against its copy (delta.ts) when that is smaller than
 * its bytes, raw otherwise, and leaves out the tensors that did not change;
 * every tensor declares the CRC-32C of its new bytes, which the server checks
 * after decoding. Otherwise, or when the server refuses the base
 * (DELTA_BASE_MISMATCH: another trainer pushed in between), the push is full.
 * Each push's way and why is kept in `history`.
 *
 * Unlike the Python client, this one does not weigh measured encode and
 * transfer costs against each other (rollout_client/weights/delta_costs.py): it
 * encodes in the one JavaScript thread, and a delta goes whenever the base
 * matches.
 */

import { applySparseXor8, encodeSparseXor8 } from "./delta";
import type { TensorSpec } from "./gen/rollout/v1/TensorSpec";
import type { UpdateWeightsBegin } from "./gen/rollout/v1/UpdateWeightsBegin";
import type { UpdateWeightsResponse__Output } from "./gen/rollout/v1/UpdateWeightsResponse";
import type { Outgoing } from "./push";
import { crc32c, tensorSpec, type WeightTensor } from "./tensors";

/** Which way one push went, and why (PushedWeights.history). */
export interface PushRecord {
  version: string;
  way: "delta" | "full";
  why: string;
  /** Bytes of the tensors given. */
  modelBytes: number;
  /** Bytes that travelled (TensorChunk data). */
  wireBytes: number;
  /** Tensors sent SPARSE_XOR8, raw, and left out unchanged (a delta's). */
  encodedTensors: number;
  rawTensors: number;
  unchangedTensors: number;
  /** Milliseconds spent on the CRC-32C and the encoding before the stream began. */
  encodeMs: number;
  /** Milliseconds from the stream's start to the acknowledgement. */
  sendMs: number;
}

/** One tensor of a delta: what travels, and the encoding applied to the copy once acknowledged. */
interface DeltaTensor {
  tensor: WeightTensor;
  spec: TensorSpec;
  wire: Uint8Array;
  sparse?: Uint8Array; // sent SPARSE_XOR8
  changed: boolean;
}

/** A delta update, ready to send, and what recording it needs. */
export interface Delta {
  outgoing: Outgoing;
  tensors: DeltaTensor[];
  encodeMs: number;
}

export class PushedWeights {
  /** The version the copies make on the server ("": none). */
  version = "";
  /** Every push's way and why, oldest first. */
  readonly history: PushRecord[] = [];
  private readonly copies = new Map<string, Uint8Array>();

  /** `maxBytes`: the most bytes of copies kept (default: no bound). */
  constructor(readonly maxBytes = Number.POSITIVE_INFINITY) {}

  /** Host memory held by the copies. */
  get nbytes(): number {
    let n = 0;
    for (const c of this.copies.values()) n += c.byteLength;
    return n;
  }

  forget(): void {
    this.version = "";
    this.copies.clear();
  }

  /** `tensors` as a delta against the copies; nothing is recorded until it is acknowledged. */
  delta(tensors: WeightTensor[], begin: UpdateWeightsBegin): Delta {
    const started = performance.now();
    const all = tensors.map((t): DeltaTensor => {
      const spec = tensorSpec(t, false);
      spec.crc32c = crc32c(t.data);
      const old = this.copies.get(t.name);
      if (old === undefined || old.byteLength !== t.data.byteLength) {
        return { tensor: t, spec, wire: t.data, changed: true };
      }
      const sparse = encodeSparseXor8(old, t.data);
      if (sparse.byteLength === 4) {
        return { tensor: t, spec, wire: sparse, sparse, changed: false };
      }
      if (sparse.byteLength >= t.data.byteLength) {
        spec.encoding = "TENSOR_ENCODING_RAW";
        return { tensor: t, spec, wire: t.data, changed: true };
      }
      spec.encoding = "TENSOR_ENCODING_SPARSE_XOR8";
      spec.encoded_bytes = sparse.byteLength;
      return { tensor: t, spec, wire: sparse, sparse, changed: true };
    });
    // A delta names at least one tensor: the first, when nothing changed.
    const sent = all.some((d) => d.changed) ? all.filter((d) => d.changed) : all.slice(0, 1);
    return {
      outgoing: {
        begin: { ...begin, base_version: this.version, tensors: sent.map((d) => d.spec) },
        data: sent.map((d) => d.wire),
      },
      tensors: all,
      encodeMs: performance.now() - started,
    };
  }

  /** The delta was acknowledged as `version`: the copies become its bytes. */
  recordDelta(d: Delta, version: string): void {
    for (const e of d.tensors) {
      if (!e.changed) continue;
      if (e.sparse !== undefined) applySparseXor8(this.copies.get(e.tensor.name)!, e.sparse);
      else this.keep(e.tensor);
    }
    this.version = version;
  }

  /** A full update of `tensors` was acknowledged; tensors it left out keep
   * their copy only if it was made on the version the update replaced. */
  recordFull(tensors: WeightTensor[], ack: UpdateWeightsResponse__Output): void {
    if (ack.previous_weight_version !== this.version) this.copies.clear();
    for (const t of tensors) this.keep(t);
    this.version = ack.weight_version;
  }

  private keep(t: WeightTensor): void {
    const old = this.copies.get(t.name);
    if (old !== undefined && old.byteLength === t.data.byteLength) {
      old.set(t.data);
      return;
    }
    this.copies.delete(t.name);
    if (this.nbytes + t.data.byteLength > this.maxBytes) return; // raw from now on
    this.copies.set(t.name, Uint8Array.from(t.data));
  }
}
