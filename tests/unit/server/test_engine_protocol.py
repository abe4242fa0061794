"""The Engine protocol (engine/protocol.py) against vLLM's AsyncLLM, read
without starting an engine: mypy does not follow vLLM, so this is where a
vLLM upgrade that renames, drops or reshapes a call the service makes shows."""

from __future__ import annotations

import inspect

import pytest
from vllm.v1.engine.async_llm import AsyncLLM

from rollout_service.engine.protocol import Engine

METHODS = sorted(
    name
    for name, value in vars(Engine).items()
    if not name.startswith("_") and inspect.isfunction(value)
)


@pytest.mark.parametrize("name", METHODS)
def test_each_call_is_asyncllms_own(name):
    ours, theirs = getattr(Engine, name), getattr(AsyncLLM, name)
    # An async generator (generate) is called, then iterated: not awaited.
    awaited = inspect.iscoroutinefunction
    assert awaited(ours) == awaited(theirs), name
    mine = inspect.signature(ours).parameters
    vllms = inspect.signature(theirs).parameters
    for p in mine.values():
        assert p.name in vllms, f"AsyncLLM.{name} takes no {p.name!r}"
        assert vllms[p.name].kind == p.kind, f"AsyncLLM.{name}({p.name}) is passed otherwise"
        assert vllms[p.name].default == p.default, f"AsyncLLM.{name}({p.name}) defaults otherwise"
    # What the service leaves out, vLLM must not require.
    required = [
        p.name
        for p in vllms.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert set(required) <= set(mine), f"AsyncLLM.{name} requires {required}"


def test_errored_is_a_property_and_the_configs_are_attributes():
    assert isinstance(inspect.getattr_static(AsyncLLM, "errored"), property)
    # Set in AsyncLLM.__init__ (not class attributes): read from its source.
    init = inspect.getsource(AsyncLLM.__init__)
    for name in Engine.__annotations__:
        assert f"self.{name} = " in init, name
