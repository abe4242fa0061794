"""GenerateStream's StreamOptions against the real engine: deltas of several
tokens, and token ids without text, lose nothing a default stream carries."""

from __future__ import annotations

import pytest

from rollout_client import pb

PROMPT = "The quick brown fox jumps over the lazy dog"
MAX = 14


def stream(client, **kw):
    kw = {"prompt_text": PROMPT, "max_tokens": MAX, "temperature": 0, "ignore_eos": True, **kw}
    return list(client.generate_stream(**kw))


def joined(deltas):
    tokens = [t for d in deltas for t in d.token_ids]
    logprobs = [lp for d in deltas for lp in d.logprobs]
    return tokens, logprobs, "".join(d.text for d in deltas)


def test_delta_tokens_groups_tokens_and_loses_none(client):
    plain = stream(client)
    grouped = stream(client, delta_tokens=4)
    assert joined(grouped)[0] == joined(plain)[0] and len(joined(plain)[0]) == MAX
    assert joined(grouped)[1] == pytest.approx(joined(plain)[1], abs=1e-5)
    assert joined(grouped)[2] == joined(plain)[2]
    counts = [len(d.token_ids) for d in grouped]
    # the first token at once (TTFT is unchanged), then groups of 4, the rest last
    assert counts[0] == 1, counts
    assert all(c >= 4 for c in counts[1:-1]), counts
    assert len(grouped) <= 1 + -(-(MAX - 1) // 4) < len(plain), (counts, len(plain))
    for d in grouped:
        assert len(d.logprobs) == len(d.token_ids)
        assert sum(s.count for s in d.version_spans) == len(d.token_ids)
    last = grouped[-1]
    assert last.finish_reason == pb.FINISH_REASON_LENGTH and last.usage.completion_tokens == MAX


def test_delta_tokens_above_the_length_sends_first_and_last(client):
    deltas = stream(client, delta_tokens=2**32 - 1)
    assert [len(d.token_ids) for d in deltas] == [1, MAX - 1]
    assert joined(deltas)[0] == joined(stream(client))[0]


def test_omit_text_sends_the_same_tokens_without_text(client):
    plain = stream(client, n=2, seed=3, temperature=1.0)
    bare = stream(client, n=2, seed=3, temperature=1.0, omit_text=True, delta_tokens=3)
    assert joined(plain)[2] and not joined(bare)[2]
    for index in (0, 1):
        mine = [d for d in bare if d.index == index]
        theirs = [d for d in plain if d.index == index]
        assert joined(mine)[0] == joined(theirs)[0]
        assert joined(mine)[1] == pytest.approx(joined(theirs)[1], abs=1e-5)


def test_omit_text_still_honours_stop_strings(client):
    full = client.generate(prompt_text=PROMPT, max_tokens=MAX, temperature=0).completions[0]
    stop = full.text[len(full.text) // 2 :][:3]
    assert stop.strip(), full.text
    deltas = list(
        client.generate_stream(
            prompt_text=PROMPT, max_tokens=MAX, temperature=0, stop=[stop], omit_text=True
        )
    )
    cut = client.generate(prompt_text=PROMPT, max_tokens=MAX, temperature=0, stop=[stop])
    assert joined(deltas)[0] == list(cut.completions[0].token_ids) != list(full.token_ids)
    assert deltas[-1].finish_reason == pb.FINISH_REASON_STOP and not joined(deltas)[2]
