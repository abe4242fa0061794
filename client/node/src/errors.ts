/**
 * The error every call of the client rejects with (RolloutClient's own and
 * Session's): the gRPC status, the server's message, and the ErrorInfo
 * reason read from the status details, so callers branch on a documented
 * reason instead of parsing messages. Its own module so that every surface
 * of the client imports it without importing client.ts (no import loops).
 */

import * as grpc from "@grpc/grpc-js";

/** The length-delimited and varint fields of one protobuf message, by number. */
function protoFields(buf: Buffer): Map<number, Buffer[]> {
  const out = new Map<number, Buffer[]>();
  let i = 0;
  const varint = (): number => {
    let v = 0;
    let shift = 0;
    for (;;) {
      const b = buf[i++];
      v += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return v;
      shift += 7;
    }
  };
  while (i < buf.length) {
    const key = varint();
    const wire = key & 7;
    if (wire === 0) varint();
    else if (wire === 2) {
      const n = varint();
      const field = key >>> 3;
      out.set(field, [...(out.get(field) ?? []), buf.subarray(i, i + n)]);
      i += n;
    } else if (wire === 1) i += 8;
    else if (wire === 5) i += 4;
    else break;
  }
  return out;
}

/**
 * The ErrorInfo reason in a status's `grpc-status-details-bin` trailer (a
 * google.rpc.Status), e.g. "VERSION_ALREADY_SERVED" (rollout.v1.ErrorReason
 * without its prefix), or "" when there is none.
 */
export function errorReason(metadata?: grpc.Metadata): string {
  const raw = metadata?.get("grpc-status-details-bin")?.[0];
  if (!raw) return "";
  try {
    for (const any of protoFields(Buffer.from(raw as Buffer)).get(3) ?? []) {
      const f = protoFields(any);
      const typeUrl = f.get(1)?.[0]?.toString() ?? "";
      if (typeUrl.endsWith("/google.rpc.ErrorInfo")) {
        return protoFields(f.get(2)?.[0] ?? Buffer.alloc(0)).get(1)?.[0]?.toString() ?? "";
      }
    }
  } catch {
    return "";
  }
  return "";
}

/**
 * A failed call: `code` is the gRPC status code, `details` the server's
 * message, `reason` the documented rollout.v1.ErrorReason name (without its
 * prefix; "" for gRPC's own statuses), to branch on without parsing messages.
 */
export class RolloutError extends Error {
  readonly code: grpc.status;
  readonly codeName: string;
  readonly details: string;
  readonly reason: string;
  readonly metadata?: grpc.Metadata;

  constructor(code: grpc.status, details: string, metadata?: grpc.Metadata) {
    const codeName = grpc.status[code] ?? String(code);
    super(`${codeName}: ${details}`);
    this.name = "RolloutError";
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.reason = errorReason(metadata);
    this.metadata = metadata;
  }

  static wrap(e: unknown): RolloutError {
    if (e instanceof RolloutError) return e;
    const se = e as Partial<grpc.ServiceError>;
    if (se && typeof se.code === "number") {
      return new RolloutError(se.code, se.details ?? se.message ?? "", se.metadata);
    }
    return new RolloutError(grpc.status.UNKNOWN, e instanceof Error ? e.message : String(e));
  }
}
