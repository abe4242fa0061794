/**
 * How one call is made, for every surface of the client: RolloutClient's own
 * methods and a Session's. Written once so that the two cannot drift: each
 * call gets its deadline here, a callback becomes a promise, a server stream
 * becomes an async iterator that cancels the call when the loop is left
 * early, and every failure becomes a RolloutError.
 *
 * The bearer token, TLS and the retry policy are not here: they belong to the
 * channel (RolloutClient's constructor), so every call made on its stub has
 * them, whichever surface made it.
 */

import type * as grpc from "@grpc/grpc-js";

import { RolloutError } from "./errors";
import type { RolloutServiceClient } from "./gen/rollout/v1/RolloutService";

export interface CallOpts {
  /** Deadline of this call, in milliseconds; default the client's timeoutMs. */
  timeoutMs?: number;
}

/** A unary method of the stub, in the overload that takes call options. */
export type UnaryMethod<Req, Res> = (
  request: Req,
  options: grpc.CallOptions,
  callback: grpc.requestCallback<Res>,
) => unknown;

/** A server-streaming method of the stub. */
export type StreamMethod<Req, Res> = (request: Req, options: grpc.CallOptions) => grpc.ClientReadableStream<Res>;

/** Makes calls on one stub with one default deadline. */
export class Caller {
  constructor(
    readonly stub: RolloutServiceClient,
    readonly timeoutMs: number,
  ) {}

  deadline(opts?: CallOpts): Date {
    return new Date(Date.now() + (opts?.timeoutMs ?? this.timeoutMs));
  }

  unary<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, opts?: CallOpts): Promise<Res> {
    return new Promise((resolve, reject) => {
      method.call(this.stub, request, { deadline: this.deadline(opts) }, (err, res) => {
        if (err) reject(RolloutError.wrap(err));
        else resolve(res as Res);
      });
    });
  }

  /** The stream's messages; leaving the loop early cancels the call, so the
   * server stops generating for a reader that is gone. */
  async *serverStream<Req, Res>(
    method: StreamMethod<Req, Res>,
    request: Req,
    opts?: CallOpts,
  ): AsyncGenerator<Res, void, undefined> {
    const call = method.call(this.stub, request, { deadline: this.deadline(opts) });
    let finished = false;
    try {
      for await (const msg of call) {
        yield msg as Res;
      }
      finished = true;
    } catch (e) {
      finished = true;
      throw RolloutError.wrap(e);
    } finally {
      if (!finished) {
        call.on("error", () => {}); // the CANCELLED status that follows
        call.cancel();
      }
    }
  }
}
