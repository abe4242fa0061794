"""What a generation kept running across a PAUSE_MODE_KEEP update is checked
against: its version spans merged into runs, and the tokens a fresh request on
the new weights generates from its prompt and the tokens so far."""

from __future__ import annotations

PROMPT = list(range(1, 40))


def merged_spans(pieces) -> list[list]:
    """[version, start, count] runs over a whole completion, from per-message
    spans (each indexed into its own message's tokens)."""
    runs: list[list] = []
    pos = 0
    for spans, n in pieces:
        for s in spans:
            if (
                runs
                and runs[-1][0] == s.weight_version
                and runs[-1][1] + runs[-1][2] == pos + s.start
            ):
                runs[-1][2] += s.count
            else:
                runs.append([s.weight_version, pos + s.start, s.count])
        pos += n
    return runs


def fresh_continuation(client, tokens: list[int], boundary: int) -> list[int]:
    r = client.generate(
        prompt_token_ids=PROMPT + tokens[:boundary],
        max_tokens=len(tokens) - boundary,
        temperature=0,
        ignore_eos=True,
    )
    return list(r.completions[0].token_ids)
