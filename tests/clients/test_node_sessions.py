"""The Node client's sessions (client/node/src/sessions.ts), run from the
packed tarball (conftest's `packed`) against the session's secure server
(`shared_secure`: bearer tokens and mutual TLS, so the session calls are seen
to carry the client's token and TLS), and checked through the Python client:

- a trajectory of three greedy turns (unary, streamed, unary) with an append
  of ids and one of chat messages between them holds exactly the ids each
  call returned, in order, with the right sources and loss mask, and each
  turn sampled what a plain Generate on the ids before it samples;
- the session belongs to the Node client's token: the Python client reads the
  same trajectory with that token and is refused it with another;
- a bad append is refused as a RolloutError naming the field, and changes
  nothing; after close() the session is NOT_FOUND (SESSION_NOT_FOUND).
"""

from __future__ import annotations

import json

import grpc
import pytest

from rollout_client import RolloutClient, RolloutError, pb
from rollout_client.calls import core
from rollout_client.sessions import Session
from tests.support.node import PACKAGE, SECURE_CLIENT_JS, secure_cfg, start_script
from tests.support.tokens import GENERATE, GENERATE_B

GREEDY = {"temperature": 0}
# min_tokens = max_tokens: every turn samples tokens (an immediate end-of-text
# would leave a turn empty and its segment checks vacuous).
TURN = {"max_tokens": 6, "min_tokens": 6, **GREEDY}

# Opens a session and runs the trajectory, printing one JSON line of what
# every call returned; then waits for a line on stdin (the Python side's
# checks of the open session) before closing it and printing a second line.
SCRIPT = f"""
const {{ RolloutClient, lossMask }} = require({PACKAGE!r});
{SECURE_CLIENT_JS}
const failure = async (f) => {{
  try {{ await f(); return null; }}
  catch (e) {{ return {{ name: e.name, code: e.codeName, reason: e.reason, details: e.details }}; }}
}};
(async () => {{
  const s = await client.openSession({{ prompt_token_ids: cfg.prompt, max_total_tokens: 512 }});
  const turn1 = await s.generate(cfg.turn, {{ requestId: "node-session-turn-1" }});
  const append1 = await s.append({{ tokenIds: cfg.appendIds }});
  const stream2 = [];
  for await (const m of s.generateStream(cfg.turn, {{ deltaTokens: 2 }})) stream2.push(m);
  const append2 = await s.append({{ messages: [{{ role: "tool", content: "4" }}] }});
  const turn3 = await s.generate(cfg.turn);
  const badAppend = await failure(() => s.append({{ tokenIds: [1, cfg.vocab + 7] }}));
  const trajectory = await s.trajectory();
  console.log(JSON.stringify({{ id: s.id, opened: s.opened, turn1, append1, stream2, append2,
    turn3, badAppend, trajectory, mask: lossMask(trajectory) }}));
  const stdin = readline.createInterface({{ input: process.stdin }});
  await new Promise((resolve) => stdin.once("line", resolve));
  stdin.close();
  const closed = await s.close();
  const afterClose = await failure(() => s.trajectory());
  const appendAfterClose = await failure(() => s.append({{ tokenIds: [5] }}));
  client.close();
  console.log(JSON.stringify({{ closed, afterClose, appendAfterClose }}));
  process.exit(0);
}})().catch((e) => {{ console.error(e); process.exit(1); }});
"""


@pytest.fixture(scope="module")
def clients(shared_secure):
    """Python clients of the secure server: the Node client's caller, another one."""
    options = {"timeout": 120, "retries": 0, **shared_secure.tls}
    with (
        RolloutClient(shared_secure.proc.target, token=GENERATE, **options) as own,
        RolloutClient(shared_secure.proc.target, token=GENERATE_B, **options) as other,
    ):
        yield own, other


def _segments(pieces: list[tuple[str, list[int]]]) -> list[tuple[str, int, int]]:
    """The (source, start, count) of each non-empty piece, laid end to end."""
    out, start = [], 0
    for source, ids in pieces:
        if ids:
            out.append((source, start, len(ids)))
            start += len(ids)
    return out


def test_packed_client_session_trajectory_token_for_token(packed, shared_secure, clients):
    own, other = clients
    prompt = list(own.tokenize(text="The store opens at nine").token_ids)
    append_ids = list(own.tokenize(text=" and closes at").token_ids)
    vocab = own.server_info().vocab_size
    cfg = secure_cfg(
        shared_secure, GENERATE, prompt=prompt, appendIds=append_ids, vocab=vocab, turn=TURN
    )
    node = start_script(packed, "session.js", SCRIPT, cfg)
    out = None
    try:
        line = node.stdout.readline()  # '' if node died: every call has a 120 s deadline
        assert line, f"node printed nothing\n--- stderr\n{node.stderr.read()[-4000:]}"
        out = json.loads(line)
        _check_open_session(out, own, other, prompt, append_ids)
        rest, err = node.communicate("close\n", timeout=180)
    finally:
        if node.poll() is None:  # a check failed: leave no session open on the shared server
            node.kill()
            node.wait()
            if out is not None:
                Session(own, pb.OpenSessionResponse(session_id=out["id"])).close()
    assert node.returncode == 0, err[-4000:]
    closed = json.loads(rest.strip().splitlines()[-1])

    assert closed["closed"] == {"aborted_turn": False}
    for after in (closed["afterClose"], closed["appendAfterClose"]):
        assert after["name"] == "RolloutError", after
        assert (after["code"], after["reason"]) == ("NOT_FOUND", "SESSION_NOT_FOUND"), after
    # The server agrees: the session is gone for its owner too.
    with pytest.raises(RolloutError) as e:
        Session(own, pb.OpenSessionResponse(session_id=out["id"])).trajectory()
    assert (e.value.code, e.value.reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


def _check_open_session(out, own, other, prompt, append_ids):
    assert out["opened"]["prompt_token_ids"] == prompt
    turn1 = out["turn1"]["completion"]["token_ids"]
    assert out["turn1"]["request_id"] == "node-session-turn-1"
    assert out["append1"]["token_ids"] == append_ids  # ids are held as they are
    stream2 = out["stream2"]
    turn2 = [t for m in stream2 for t in m["delta"]["token_ids"]]
    assert len(stream2) >= 2, "deltaTokens 2 splits a 6-token turn"
    append2 = out["append2"]["token_ids"]
    gen_prompt3 = out["turn3"]["state"]["generation_prompt_token_ids"]
    turn3 = out["turn3"]["completion"]["token_ids"]
    assert [len(turn1), len(turn2), len(turn3)] == [6, 6, 6]
    assert append2 and gen_prompt3, "a message append renders, and asks for a generation prompt"

    pieces = [
        ("TOKEN_SOURCE_PROMPT", prompt),
        ("TOKEN_SOURCE_SAMPLED", turn1),
        ("TOKEN_SOURCE_APPENDED", append_ids),
        ("TOKEN_SOURCE_SAMPLED", turn2),
        ("TOKEN_SOURCE_APPENDED", append2),
        ("TOKEN_SOURCE_APPENDED", gen_prompt3),
        ("TOKEN_SOURCE_SAMPLED", turn3),
    ]
    held = [t for _, ids in pieces for t in ids]
    t = out["trajectory"]
    # Exactly the ids the calls returned, in order: the refused append added nothing.
    assert t["token_ids"] == held
    assert t["sources"] == [source for source, ids in pieces for _ in ids]
    assert out["mask"] == [
        int(source == "TOKEN_SOURCE_SAMPLED") for source, ids in pieces for _ in ids
    ]
    assert sum(out["mask"]) == 18
    segments = [(s["source"], s["start"], s["count"]) for s in t["segments"]]
    assert segments == _segments(pieces)
    # The streamed turn's last message carries the session's state after it.
    state2 = stream2[-1]["state"]
    assert state2["total_tokens"] == len(prompt) + 6 + len(append_ids) + 6
    assert out["turn3"]["state"]["total_tokens"] == len(held)

    bad = out["badAppend"]
    assert bad["name"] == "RolloutError", bad
    assert (bad["code"], bad["reason"]) == ("INVALID_ARGUMENT", "INVALID_FIELD"), bad
    assert bad["details"].startswith("token_ids[1]"), bad

    # The Python client, with the Node client's token, reads the same trajectory.
    py = Session(own, pb.OpenSessionResponse(session_id=out["id"])).trajectory()
    assert list(py.token_ids) == held
    assert [pb.TokenSource.Name(s) for s in py.sources] == t["sources"]
    assert list(py.logprobs) == pytest.approx(t["logprobs"], abs=1e-6)
    sampled_logprobs = [lp for lp, m in zip(t["logprobs"], out["mask"]) if m]
    turns_logprobs = (
        out["turn1"]["completion"]["logprobs"]
        + [lp for m in stream2 for lp in m["delta"]["logprobs"]]
        + out["turn3"]["completion"]["logprobs"]
    )
    assert sampled_logprobs == pytest.approx(turns_logprobs, abs=1e-6)
    # Each turn was conditioned on exactly the ids held before it: a plain
    # greedy Generate on those ids samples the same.
    before = {0: len(prompt), 1: len(prompt) + 6 + len(append_ids), 2: len(held) - 6}
    for i, (n, sampled) in enumerate(zip(before.values(), (turn1, turn2, turn3))):
        r = own.generate(prompt_token_ids=held[:n], **TURN)
        assert list(r.completions[0].token_ids) == sampled, f"turn {i + 1}"
    # The session is the Node client's token's: another caller is refused it.
    with pytest.raises(RolloutError) as e:
        Session(other, pb.OpenSessionResponse(session_id=out["id"])).trajectory()
    assert (e.value.code, e.value.reason) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "SESSION_NOT_OWNED",
    )


# An OpenAI conversation with a tool call, opened from Node; its messages
# read back per segment, whole and from segment 1 on.
MESSAGES_SCRIPT = f"""
const {{ RolloutClient }} = require({PACKAGE!r});
{SECURE_CLIENT_JS}
(async () => {{
  const s = await client.openSession({{ messages: cfg.messages, max_total_tokens: 256 }});
  await s.generate(cfg.turn);
  const whole = await s.trajectory({{ includeMessages: true }});
  const light = await s.trajectory();
  const tail = await s.trajectory({{ fromSegment: 1, includeMessages: true }});
  await s.close();
  client.close();
  console.log(JSON.stringify({{ id: s.id, whole, light, tail }}));
  process.exit(0);
}})().catch((e) => {{ console.error(e); process.exit(1); }});
"""

OPENAI_CHAT = [
    {"role": "user", "content": "Add 1 and 2."},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "Use the tool.",
        "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
    },
    {"role": "tool", "content": "3", "tool_call_id": "c1"},
]


def test_packed_client_sends_openai_messages_and_reads_each_segments_back(
    packed, shared_secure, clients
):
    """OpenAI messages (tool calls, reasoning, a tool result's id) go from
    Node as the Python client sends them, and trajectory({includeMessages})
    reads back the messages each segment was rendered from."""
    cfg = secure_cfg(shared_secure, GENERATE, messages=OPENAI_CHAT, turn=TURN)
    node = start_script(packed, "session-messages.js", MESSAGES_SCRIPT, cfg)
    out, err = node.communicate(timeout=180)
    assert node.returncode == 0, err[-4000:]
    got = json.loads(out.strip().splitlines()[-1])
    whole, light, tail = got["whole"], got["light"], got["tail"]
    assert light["messages"] == []  # only when asked
    assert len(whole["messages"]) == len(whole["segments"]) == 3  # prompt, generation prompt, turn
    prompt = whole["messages"][0]["messages"]
    # As the Python client sends the same conversation, field for field.
    expected = [
        json.loads(json.dumps(m, default=str))
        for m in (_as_dict(c) for c in core.chat_messages(OPENAI_CHAT))
    ]
    assert [_as_dict_js(m) for m in prompt] == expected
    assert prompt[1]["tool_calls"][0]["arguments"] == '{"a": 1, "b": 2}'
    assert [e["messages"] for e in whole["messages"][1:]] == [[], []]
    assert [e["messages"] for e in tail["messages"]] == [[], []]
    assert len(tail["segments"]) == 2


def _as_dict(m: pb.ChatMessage) -> dict:
    return {
        "role": m.role,
        "content": [p.text for p in m.content],
        "tool_calls": [(c.id, c.name, json.loads(c.arguments)) for c in m.tool_calls],
        "tool_call_id": m.tool_call_id,
        "reasoning": m.reasoning,
    }


def _as_dict_js(m: dict) -> dict:
    return json.loads(
        json.dumps(
            {
                "role": m["role"],
                "content": [p["text"] for p in m["content"]],
                "tool_calls": [
                    (c["id"], c["name"], json.loads(c["arguments"])) for c in m["tool_calls"]
                ],
                "tool_call_id": m["tool_call_id"],
                "reasoning": m["reasoning"],
            }
        )
    )
