/**
 * Sessions: one multi-turn trajectory (an agentic rollout) that the server
 * holds as token ids, from its prompt to its last turn. Kept in the client,
 * such a trajectory drifts: decoding a turn and encoding the history again
 * yields ids the model never sampled. A session conditions every turn on
 * exactly the ids it holds and never tokenizes them again (docs/sessions.md;
 * the proto states every rule). The same shape as the Python client's
 * (rollout_client/sessions.py):
 *
 *     const s = await client.openSession({
 *       messages: [{ role: "user", content: "What is 17 * 23?" }],
 *       max_total_tokens: 1024,
 *     });
 *     try {
 *       await s.generate({ max_tokens: 128, temperature: 1 });   // the model's turn
 *       await s.append({ messages: [{ role: "tool", content: "391" }] }); // the environment's
 *       await s.generate({ max_tokens: 128, temperature: 1 });
 *       const t = await s.trajectory(); // token_ids, sources, logprobs, version_spans, segments
 *       const mask = lossMask(t);       // 1 for sampled tokens
 *     } finally {
 *       await s.close(); // the server holds a session until closed or idle too long
 *     }
 *
 * Every call goes through the client's channel (its token, TLS and retry
 * policy, calls.ts) and rejects with a RolloutError; a session's refusals
 * carry their ErrorInfo reason (SESSION_NOT_FOUND, SESSION_NOT_OWNED,
 * SESSION_BUSY, SESSION_BUDGET, ...) in `reason`. Of the session calls only
 * GetSession is retried on UNAVAILABLE: the others are not safe to send twice.
 */

import type { Caller, CallOpts } from "./calls";
import type { AppendToSessionResponse__Output } from "./gen/rollout/v1/AppendToSessionResponse";
import type { ChatMessage } from "./gen/rollout/v1/ChatMessage";
import type { CloseSessionResponse__Output } from "./gen/rollout/v1/CloseSessionResponse";
import type { GetSessionResponse__Output } from "./gen/rollout/v1/GetSessionResponse";
import type { HistoryRule } from "./gen/rollout/v1/HistoryRule";
import type { OpenSessionRequest } from "./gen/rollout/v1/OpenSessionRequest";
import type { OpenSessionResponse__Output } from "./gen/rollout/v1/OpenSessionResponse";
import type { SamplingParams } from "./gen/rollout/v1/SamplingParams";
import type { SessionGenerateResponse__Output } from "./gen/rollout/v1/SessionGenerateResponse";
import type { SessionGenerateStreamResponse__Output } from "./gen/rollout/v1/SessionGenerateStreamResponse";

export type * from "./gen/rollout/v1/AppendToSessionResponse";
export type * from "./gen/rollout/v1/ChatMessage";
export type * from "./gen/rollout/v1/CloseSessionResponse";
export type * from "./gen/rollout/v1/ContentPart";
export type * from "./gen/rollout/v1/GetSessionResponse";
export type * from "./gen/rollout/v1/OpenSessionRequest";
export type * from "./gen/rollout/v1/OpenSessionResponse";
export type * from "./gen/rollout/v1/SessionGenerateResponse";
export type * from "./gen/rollout/v1/SessionGenerateStreamResponse";
export type * from "./gen/rollout/v1/SessionState";
export type * from "./gen/rollout/v1/TrajectorySegment";
export type * from "./gen/rollout/v1/VersionSpan";
export type { AppendRender, AppendRender__Output } from "./gen/rollout/v1/AppendRender";
export type { HistoryRule, HistoryRule__Output } from "./gen/rollout/v1/HistoryRule";
export type { TokenSource, TokenSource__Output } from "./gen/rollout/v1/TokenSource";

/** A chat message as the proto has it, or as an OpenAI chat message: its
 * text as a plain string (or null), an assistant's `tool_calls` (arguments
 * as JSON text or a value) and `reasoning`, a tool result's `tool_call_id`
 * (as the Python client takes them). Sessions take text only. */
export type SessionMessage = ChatMessage | OpenAIMessage;

/** An OpenAI chat message, text only. */
export interface OpenAIMessage {
  role: string;
  content: string | null;
  tool_calls?: { id?: string; function: { name: string; arguments?: unknown } }[];
  tool_call_id?: string;
  reasoning?: string;
}

/** GetSession's options: `fromSegment` reads only the segments from there
 * on; `includeMessages` also the chat messages each segment was rendered
 * from (GetSessionResponse.messages, what a resume needs). */
export interface TrajectoryOptions extends CallOpts {
  fromSegment?: number;
  includeMessages?: boolean;
}

/** What a session's base URL does with a chat whose messages do not extend
 * the held ones (HistoryRule): refuse it (HISTORY_DIVERGED), or restart the
 * context from it. */
export type HistoryRuleName = "refuse" | "restart";

const HISTORY_RULES: Record<HistoryRuleName, HistoryRule> = {
  refuse: "HISTORY_RULE_REFUSE",
  restart: "HISTORY_RULE_RESTART",
};

/** OpenSessionRequest, its messages also with plain-string content, and
 * `historyRule` by name (as the Python client's `history_rule`; the proto's
 * `history_rule` also works, not both). Every other field is the proto's as
 * it is, so a field the proto gains is accepted without a change here. */
export type OpenSessionInput = Omit<OpenSessionRequest, "messages"> & {
  messages?: SessionMessage[];
  historyRule?: HistoryRuleName;
};

/** The environment's output: token ids held as they are, or chat messages
 * the server renders with the chat template (exactly one of them). */
export type AppendInput =
  | { tokenIds: number[]; messages?: never }
  | { messages: SessionMessage[]; tokenIds?: never };

export interface TurnOptions extends CallOpts {
  /** For logs and Abort; the server makes one when empty. */
  requestId?: string;
}

export interface StreamTurnOptions extends TurnOptions {
  /** StreamOptions.delta_tokens: tokens gathered into one delta (0: one per engine step). */
  deltaTokens?: number;
  /** StreamOptions.omit_text: token ids only. */
  omitText?: boolean;
}

function isOpenAI(m: SessionMessage): m is OpenAIMessage {
  const calls = (m as { tool_calls?: unknown[] }).tool_calls ?? [];
  return (
    typeof m.content === "string" ||
    m.content === null ||
    calls.some((c) => typeof c === "object" && c !== null && "function" in c)
  );
}

/** ChatMessage protos from protos or OpenAI messages (SessionMessage). */
export function chatMessages(messages: readonly SessionMessage[]): ChatMessage[] {
  return messages.map((m) => {
    if (!isOpenAI(m)) return m;
    const o = m;
    return {
      role: o.role,
      content: o.content ? [{ text: o.content }] : [],
      tool_calls: (o.tool_calls ?? []).map((c) => ({
        id: c.id ?? "",
        name: c.function.name,
        arguments:
          typeof c.function.arguments === "string"
            ? c.function.arguments
            : JSON.stringify(c.function.arguments ?? {}),
      })),
      tool_call_id: o.tool_call_id ?? "",
      reasoning: o.reasoning ?? "",
    };
  });
}

/** 1 for each sampled token (what a trainer's loss counts), 0 for prompt and
 * appended ones; aligned with the trajectory's token_ids. */
export function lossMask(trajectory: Pick<GetSessionResponse__Output, "sources">): number[] {
  return trajectory.sources.map((s) => (s === "TOKEN_SOURCE_SAMPLED" ? 1 : 0));
}

/** The OpenSessionRequest `req` asks for; a RangeError naming `historyRule`
 * when it is not a rule's name or comes with `history_rule`. */
export function openRequest(req: OpenSessionInput): OpenSessionRequest {
  const { historyRule, ...fields } = req;
  const request: OpenSessionRequest = { ...fields, messages: chatMessages(req.messages ?? []) };
  if (historyRule !== undefined) {
    if (!Object.hasOwn(HISTORY_RULES, historyRule)) {
      throw new RangeError(`historyRule: ${JSON.stringify(historyRule)} is not "refuse" or "restart"`);
    }
    if (req.history_rule !== undefined) {
      throw new RangeError("historyRule: set it or history_rule, not both");
    }
    request.history_rule = HISTORY_RULES[historyRule];
  }
  return request;
}

/** Opens a session on `calls` (RolloutClient.openSession). */
export async function openSession(calls: Caller, req: OpenSessionInput, opts?: CallOpts): Promise<Session> {
  const request = openRequest(req);
  return new Session(calls, await calls.unary(calls.stub.OpenSession, request, opts));
}

/** An open session. The server holds it until close() or until it stays idle
 * past opened.idle_timeout_seconds: close it in a `finally`. */
export class Session {
  /** OpenSessionResponse.session_id: names the session in every call. */
  readonly id: string;

  constructor(
    private readonly calls: Caller,
    /** What OpenSession answered: the prompt as held, the version, the budget. */
    readonly opened: OpenSessionResponse__Output,
  ) {
    this.id = opened.session_id;
  }

  /** The session as an OpenAI base URL (OpenSessionResponse.base_url): every
   * chat completion there, e.g. from the `openai` package's client, is a turn
   * of this session. Empty when the server runs without --http-port. */
  get baseUrl(): string {
    return this.opened.base_url;
  }

  /** The next model turn, conditioned on exactly the ids the session holds;
   * what it samples is appended as it is. `params` are SamplingParams (n 1). */
  generate(params: SamplingParams = {}, opts: TurnOptions = {}): Promise<SessionGenerateResponse__Output> {
    const { stub } = this.calls;
    const request = { session_id: this.id, request_id: opts.requestId ?? "", sampling_params: params };
    return this.calls.unary(stub.SessionGenerate, request, opts);
  }

  /** The next turn, streamed: each message's `delta` as GenerateStream sends
   * it; the last also carries `state`. Leaving the loop early cancels the
   * call, which interrupts the turn: its partial tokens stay in the session
   * and the next generate resumes it. */
  generateStream(
    params: SamplingParams = {},
    opts: StreamTurnOptions = {},
  ): AsyncGenerator<SessionGenerateStreamResponse__Output, void, undefined> {
    const request = {
      session_id: this.id,
      request_id: opts.requestId ?? "",
      sampling_params: params,
      stream_options: { delta_tokens: opts.deltaTokens ?? 0, omit_text: opts.omitText ?? false },
    };
    return this.calls.serverStream(this.calls.stub.SessionGenerateStream, request, opts);
  }

  /** Appends the environment's output; resolves with the ids appended (for
   * messages: as the template rendered them). */
  append(what: AppendInput, opts?: CallOpts): Promise<AppendToSessionResponse__Output> {
    const request = {
      session_id: this.id,
      token_ids: what.tokenIds ?? [],
      messages: chatMessages(what.messages ?? []),
    };
    return this.calls.unary(this.calls.stub.AppendToSession, request, opts);
  }

  /** Every token id the session holds with its source, the sampled ones'
   * logprobs and versions, and the segments (prompt, turns, appends); with
   * `includeMessages`, the chat messages each segment came from. */
  trajectory(opts?: TrajectoryOptions): Promise<GetSessionResponse__Output> {
    const request = {
      session_id: this.id,
      from_segment: opts?.fromSegment ?? 0,
      include_messages: opts?.includeMessages ?? false,
    };
    return this.calls.unary(this.calls.stub.GetSession, request, opts);
  }

  /** Closes the session and frees what the server holds for it; a turn
   * running on it is aborted first (`aborted_turn`). */
  close(opts?: CallOpts): Promise<CloseSessionResponse__Output> {
    return this.calls.unary(this.calls.stub.CloseSession, { session_id: this.id }, opts);
  }
}
