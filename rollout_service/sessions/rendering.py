"""The template rule: what a session appends when chat messages follow its
history, without ever re-tokenizing what it holds.

The held ids are the truth; the chat template is asked only what it renders
*after* them. Both renders are text:

- `before`: the conversation so far, as the template renders it, ending
  exactly where the held ids end. When a model turn came last, its assistant
  message is rendered with a stand-in content, cut at it, and the turn's own
  decoded text put in its place: the held ids end at the sampled content, not
  at the template's end-of-message (Hugging Face's continue_final_message
  strips trailing whitespace, which the next bridge would then repeat).
- `after`: the conversation with the new messages (and the generation prompt
  when a turn is about to start).

`after` must start with `before` (the template renders history append-only);
what follows is the bridge, tokenized alone. A template that rewrites
earlier messages once more follow (dropping `<think>` blocks) fails the check:
TEMPLATE_NOT_APPEND_ONLY, nothing changes. The isolated mode renders against
a fixed stand-in conversation instead of the session's own, so that check
concerns the template only, never the history.

Pure: the render function is passed in (Tokenizing.render_conversation on
the tokenizing thread); tested without an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import FailedPrecondition

# render(conversation, add_generation_prompt) -> text
Render = Callable[[list[dict[str, Any]], bool], str]

# A model turn's content while `before` is rendered: no template touches it.
_SENTINEL = "\x00rollout-session-turn\x00"
STAND_IN_USER = {"role": "user", "content": "x"}
STAND_IN_ASSISTANT = {"role": "assistant", "content": "y"}


def not_append_only(why: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"messages: {why}; nothing was appended (open the session with "
        "append_render APPEND_RENDER_ISOLATED to render new messages alone)",
        reason=pb.ERROR_REASON_TEMPLATE_NOT_APPEND_ONLY,
    )


def _before(render: Render, history: list[dict[str, Any]], last_is_turn: bool) -> str:
    if not last_is_turn:
        return render(history, False)
    *head, last = history
    text = render([*head, {**last, "content": _SENTINEL}], False)
    if text.count(_SENTINEL) != 1:
        raise not_append_only("the chat template does not render a model turn's content as it is")
    return text[: text.index(_SENTINEL)] + last["content"]


def bridge(
    render: Render,
    history: list[dict[str, Any]],
    last_is_turn: bool,
    new: Sequence[dict[str, Any]],
    add_generation_prompt: bool,
) -> str:
    """The text the template renders after `history` (whose last message is a
    model turn's when `last_is_turn`) for the messages `new` (and the
    generation prompt); FailedPrecondition (TEMPLATE_NOT_APPEND_ONLY) when the
    template renders `history` differently once they follow."""
    before = _before(render, history, last_is_turn)
    after = render([*history, *new], add_generation_prompt)
    if not after.startswith(before):
        at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), len(after))
        raise not_append_only(
            "the chat template renders the session's history differently once new "
            f"messages follow it (from character {at} of {len(before)} on: "
            f"{before[at : at + 40]!r} became {after[at : at + 40]!r})"
        )
    return after[len(before) :]


def stand_in(last_is_turn: bool) -> list[dict[str, Any]]:
    """The isolated mode's fixed history."""
    return [STAND_IN_USER, STAND_IN_ASSISTANT] if last_is_turn else [STAND_IN_USER]


def drop_sampled_stop(ids: list[int], stop_token: int | None) -> list[int]:
    """The bridge's ids without its first when the last turn ended on that
    very stop token (the model sampled the template's end-of-turn itself)."""
    if stop_token is not None and ids and ids[0] == stop_token:
        return ids[1:]
    return ids
