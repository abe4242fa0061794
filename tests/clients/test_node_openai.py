"""The official `openai` npm package on a session's base URL, the session
opened by the Node client (client/node, packed as a user installs it;
`openSession({ historyRule })`, `session.baseUrl`), on a real engine with
the HTTP front and tokens (conftest's http_sessions_server):

- a multi-turn episode: a forced tool call (a named function), the tool's
  result appended as the SDK user's own loop appends it, a text turn; the
  session's GetSession ids are exactly the ids the responses reported
  (`return_token_ids`), with their logprobs and versions;
- another token's call on the URL is refused (403, SESSION_NOT_OWNED), and
  the SDK says so in its own error class;
- `historyRule: "restart"` reaches the server: an edited history starts a
  new context (a segment marked restarts_context) instead of a refusal; a
  rule that is not one is refused in the client, naming historyRule.

The `openai` package is a devDependency of client/node (`npm ci` there,
which scripts/setup --dev runs); the script loads it from there.
"""

from __future__ import annotations

import json

import pytest

from rollout_client import RolloutClient
from tests.support.node import NODE_DIR, PACKAGE, start_script
from tests.support.tokens import GENERATE, GENERATE_B

# A key-value tool; bounded arguments, so that a random model's forced call parses.
KEY = {"key": {"enum": ["oslo", "bergen"]}}
LOOKUP = {"type": "object", "properties": KEY, "required": ["key"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}}]

SCRIPT = f"""
const {{ RolloutClient }} = require({PACKAGE!r});
const {{ OpenAI }} = require(require.resolve("openai", {{ paths: [{str(NODE_DIR)!r}] }}));
const cfg = JSON.parse(process.argv[2]);
const client = new RolloutClient(cfg.target, {{ token: cfg.token, timeoutMs: 120000, retries: 0 }});
const sdk = (baseURL, apiKey) => new OpenAI({{ baseURL, apiKey, maxRetries: 0, timeout: 120000 }});
const failure = async (f) => {{
  try {{ await f(); return null; }}
  catch (e) {{ return {{ name: e.constructor.name, status: e.status, code: e.code, param: e.param,
                        message: e.message }}; }}
}};
const text = {{ model: "tiny-qwen2", max_tokens: 6, temperature: 0, ignore_eos: true,
                logprobs: true, return_token_ids: true }};
(async () => {{
  const start = [{{ role: "system", content: "You look facts up." }},
                 {{ role: "user", content: "What is known about Oslo?" }}];
  const s = await client.openSession({{
    messages: start, tools_json: cfg.tools.map((t) => JSON.stringify(t)), max_total_tokens: 2048,
  }});
  const agent = sdk(s.baseUrl, cfg.token);
  const messages = [...start];
  // The agent's own loop: a forced call, the tool's result, the next turn.
  const first = await agent.chat.completions.create({{
    ...text, messages, max_tokens: 120, ignore_eos: false, tools: cfg.tools,
    tool_choice: {{ type: "function", function: {{ name: "lookup" }} }},
  }});
  const call = first.choices[0].message.tool_calls[0];
  const result = {{ role: "tool", tool_call_id: call.id, content: "capital of Norway" }};
  messages.push(first.choices[0].message, result);
  const second = await agent.chat.completions.create({{ ...text, messages }});
  const otherToken = await failure(() =>
    sdk(s.baseUrl, cfg.otherToken).chat.completions.create({{ ...text, messages }}));
  const trajectory = await s.trajectory();
  await s.close();

  // historyRule "restart": an edited history restarts the context.
  const r = await client.openSession({{ messages: start, historyRule: "restart" }});
  const restarted = sdk(r.baseUrl, cfg.token);
  const once = await restarted.chat.completions.create({{ ...text, messages: start }});
  const edited = [start[0], {{ role: "user", content: "And about Bergen?" }}];
  const again = await restarted.chat.completions.create({{ ...text, messages: edited }});
  const restartTrajectory = await r.trajectory();
  await r.close();
  const badRule = await failure(() =>
    client.openSession({{ messages: start, historyRule: "sometimes" }}));
  client.close();
  console.log(JSON.stringify({{ id: s.id, baseUrl: s.baseUrl, restartUrl: r.baseUrl,
    restartId: r.id, first, second, otherToken, trajectory, once, again, restartTrajectory,
    badRule }}));
}})().catch((e) => {{ console.error(e); process.exit(1); }});
"""


@pytest.fixture(scope="module")
def episode(packed, http_sessions_server):
    proc = http_sessions_server
    cfg = {"target": proc.target, "token": GENERATE, "otherToken": GENERATE_B, "tools": TOOLS}
    node = start_script(packed, "openai-session.js", SCRIPT, cfg)
    out, err = node.communicate(timeout=600)
    assert node.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1]), f"http://127.0.0.1:{proc.http_port}"


def _ids(response: dict) -> tuple[list[int], list[int]]:
    return response["prompt_token_ids"], response["choices"][0]["token_ids"]


def test_the_sdk_episode_is_exactly_the_trajectory_get_session_reads(episode, http_sessions_server):
    out, root = episode
    assert out["baseUrl"] == f"{root}/sessions/{out['id']}/v1"
    first, second = out["first"], out["second"]
    [call] = first["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"])["key"] in ("oslo", "bergen")
    t = out["trajectory"]
    prompt2, ids2 = _ids(second)
    assert t["token_ids"] == prompt2 + ids2 and len(ids2) == 6
    prompt1, ids1 = _ids(first)
    assert prompt2[: len(prompt1) + len(ids1)] == prompt1 + ids1  # nothing re-tokenized
    sampled = [
        (s["start"], s["count"]) for s in t["segments"] if s["source"] == "TOKEN_SOURCE_SAMPLED"
    ]
    assert sampled == [(len(prompt1), len(ids1)), (len(prompt2), len(ids2))]
    for r, (start, count) in zip((first, second), sampled):
        got = [c["logprob"] for c in r["choices"][0]["logprobs"]["content"]]
        assert t["logprobs"][start : start + count] == pytest.approx(got, abs=1e-4)
        spans = [(v["weight_version"], v["start"], v["count"]) for v in t["version_spans"]]
        assert (r["weight_version"], start, count) in spans
    # The tool's result was appended between the turns, by the template.
    end = len(prompt1) + len(ids1)
    assert set(t["sources"][end : len(prompt2)]) == {"TOKEN_SOURCE_APPENDED"}
    with RolloutClient(http_sessions_server.target, token=GENERATE, timeout=120) as c:
        assert "capital of Norway" in c.detokenize(t["token_ids"][end : len(prompt2)]).text


def test_another_tokens_call_on_the_url_is_refused(episode):
    out, _ = episode
    refused = out["otherToken"]
    assert refused["name"] == "PermissionDeniedError", refused
    assert (refused["status"], refused["code"]) == (403, "SESSION_NOT_OWNED"), refused
    # The refused call added nothing: the trajectory ends with the owner's turn.
    assert out["trajectory"]["token_ids"] == sum(_ids(out["second"]), [])


def test_history_rule_restart_reaches_the_server(episode):
    out, root = episode
    assert out["restartUrl"] == f"{root}/sessions/{out['restartId']}/v1"
    t = out["restartTrajectory"]
    [restart] = [s for s in t["segments"] if s["restarts_context"]]
    first_turn = sum(_ids(out["once"]), [])
    assert t["token_ids"][: restart["start"]] == first_turn  # kept, before the break
    # The turn after it was conditioned on the new context only.
    assert t["token_ids"][restart["start"] :] == sum(_ids(out["again"]), [])
    bad = out["badRule"]
    assert bad["name"] == "RangeError" and bad["message"].startswith("historyRule:"), bad
