"""benchmarks.lib.chat_turns' counts, engine-free: the sampled tokens a re-sent
history re-tokenized, and the OpenAI usage read as the sessions benchmark's."""

from __future__ import annotations

from benchmarks.lib.chat_turns import ChatTally, drifted, usage

SAMPLED = [7, 8, 9]


def test_a_history_that_kept_the_sampled_ids_drifted_none():
    assert drifted([1, 2, 7, 8, 9, 3, 4], SAMPLED, start=2) == 0


def test_ids_re_encoded_otherwise_count_at_their_positions():
    # one token re-encoded as another
    assert drifted([1, 2, 7, 80, 9, 3], SAMPLED, start=2) == 1
    # two tokens merged into one: every position from there holds another id
    assert drifted([1, 2, 78, 9, 3], SAMPLED, start=2) == 3
    # the prompt ends before the sampled stretch does
    assert drifted([1, 2, 7], SAMPLED, start=2) == 2


def test_usage_reads_cached_tokens_and_tallies_turns_after_the_first():
    first = usage({"usage": {"prompt_tokens": 300, "completion_tokens": 40}})
    second = usage(
        {
            "usage": {
                "prompt_tokens": 400,
                "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 256},
            }
        }
    )
    assert (first.cached_prompt_tokens, second.cached_prompt_tokens) == (0, 256)
    tally, other = ChatTally(), ChatTally(resent=40, retokenized=3)
    tally.turn(first, None)
    tally.turn(second, first)
    tally.add(other)
    assert (tally.output, tally.history, tally.cached) == (60, 400, 256)
    assert tally.ceiling == 256  # whole blocks of the 339 tokens computed before
    assert (tally.resent, tally.retokenized) == (40, 3)
