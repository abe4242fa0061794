/**
 * TENSOR_ENCODING_SPARSE_XOR8, the delta encoding of a weight update, as
 * rollout.proto defines it: a tensor's new bytes as the bytes that changed
 * against the same tensor in UpdateWeightsBegin.base_version.
 *
 *   K:       uint32, little-endian: the number of entries
 *   x[0..K): K uint8: XOR values
 *   g[0..K): K uint8: gaps, each >= 1
 *
 * Entry i names byte p[i] = g[0] + ... + g[i] - 1; two changed bytes more
 * than 255 bytes apart are bridged by entries (0, 255). The Python client's
 * encoder (rollout_codecs/delta.py) writes the same bytes for the same input,
 * which the repository's tests check on the edge cases of the C++ client's.
 */

/** The most bytes SPARSE_XOR8 takes for a tensor of `nbytes` (TensorSpec.encoded_bytes' limit). */
export function sparseXor8Bound(nbytes: number): number {
  return 4 + 2 * (nbytes + Math.floor(nbytes / 255) + 1);
}

/**
 * SPARSE_XOR8 of `next` against `base` (two tensors of one byte length).
 * Where both are 4-byte aligned it compares 4 bytes at a time and skips the
 * equal ones (after one RL step most bytes are equal).
 */
export function encodeSparseXor8(base: Uint8Array, next: Uint8Array): Uint8Array {
  const n = next.byteLength;
  if (base.byteLength !== n) {
    throw new RangeError(`the base has ${base.byteLength} bytes, the new tensor ${n}`);
  }
  // Room for every byte and every bridge; pages are touched only as far as
  // entries are written.
  const room = n + Math.floor(n / 255) + 1;
  const values = new Uint8Array(room);
  const gaps = new Uint8Array(room);
  let k = 0;
  let prev = -1;
  const emit = (j: number, x: number) => {
    let d = j - prev;
    while (d > 255) {
      gaps[k++] = 255; // values[k] is 0 already
      d -= 255;
    }
    values[k] = x;
    gaps[k++] = d;
    prev = j;
  };
  let start = 0;
  if (base.byteOffset % 4 === 0 && next.byteOffset % 4 === 0) {
    const words = n >>> 2;
    const b32 = new Uint32Array(base.buffer, base.byteOffset, words);
    const n32 = new Uint32Array(next.buffer, next.byteOffset, words);
    for (let w = 0; w < words; w++) {
      if (b32[w] === n32[w]) continue;
      const at = w << 2;
      for (let j = at; j < at + 4; j++) {
        const x = base[j] ^ next[j];
        if (x !== 0) emit(j, x);
      }
    }
    start = words << 2;
  }
  for (let j = start; j < n; j++) {
    const x = base[j] ^ next[j];
    if (x !== 0) emit(j, x);
  }
  const out = new Uint8Array(4 + 2 * k);
  new DataView(out.buffer).setUint32(0, k, true);
  out.set(values.subarray(0, k), 4);
  out.set(gaps.subarray(0, k), 4 + k);
  return out;
}

/**
 * XORs SPARSE_XOR8 bytes into `target` (the base tensor's bytes) in place,
 * after checking them against it; a RangeError says what is wrong.
 */
export function applySparseXor8(target: Uint8Array, payload: Uint8Array): void {
  if (payload.byteLength < 4) {
    throw new RangeError(`${payload.byteLength} bytes: shorter than the 4-byte entry count`);
  }
  const k = new DataView(payload.buffer, payload.byteOffset, 4).getUint32(0, true);
  if (payload.byteLength !== 4 + 2 * k) {
    throw new RangeError(`${payload.byteLength} bytes, but its entry count ${k} makes it ${4 + 2 * k}`);
  }
  let last = -1;
  for (let i = 0; i < k; i++) {
    const g = payload[4 + k + i];
    if (g === 0) throw new RangeError(`gap ${i} is 0 (every gap is >= 1)`);
    last += g;
  }
  if (last >= target.byteLength) {
    throw new RangeError(`names byte ${last}, but the tensor has ${target.byteLength}`);
  }
  let p = -1;
  for (let i = 0; i < k; i++) {
    p += payload[4 + k + i];
    target[p] ^= payload[4 + i];
  }
}
