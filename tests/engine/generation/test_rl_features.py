"""What RL trainers need beyond plain generation, against the real engine:
prompt logprobs, Abort, chat messages, Tokenize/Detokenize and the
tokenizer's facts, structured outputs, and Sleep where the platform has none."""

from __future__ import annotations

import re
import threading
import time

import grpc
import pytest
from transformers import AutoTokenizer

from rollout_client import pb
from rollout_service.engine.tiny_models import ensure_model
from tests.support.refusals import refused
from tests.support.structured import constrained

PROMPT = [5, 17, 42, 99, 7, 250, 31, 8, 64, 12]


@pytest.fixture(scope="module")
def stub(client):
    return client.stub


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The embedded model's tokenizer, loaded apart from the server."""
    return AutoTokenizer.from_pretrained(ensure_model("tiny-qwen2"))


def gen(stub, **kw) -> pb.GenerateResponse:
    sampling = kw.pop("sampling", {})
    sampling.setdefault("max_tokens", 8)
    sampling.setdefault("temperature", 0)
    return stub.Generate(
        pb.GenerateRequest(sampling_params=pb.SamplingParams(**sampling), **kw), timeout=120
    )


def test_logprobs_come_from_the_reported_distribution(info):
    # vLLM's default: the raw model distribution
    # (tests/engine/generation/test_engine_options.py runs a server with
    # --logprobs-mode processed_logprobs).
    assert info.logprobs_mode == pb.LOGPROBS_MODE_RAW_LOGPROBS


def test_prompt_logprobs_score_the_prompt_like_generation_does(stub):
    first = gen(stub, prompt_token_ids=PROMPT, sampling={"max_tokens": 1, "logprobs": 0})
    token, logprob = first.completions[0].token_ids[0], first.completions[0].logprobs[0]
    scored = gen(
        stub,
        prompt_token_ids=[*PROMPT, token],
        sampling={"max_tokens": 1, "prompt_logprobs": 2},
    )
    # every prompt token after the first, scored given the ones before it
    assert len(scored.prompt_logprobs) == len(PROMPT)
    assert all(lp <= 0 for lp in scored.prompt_logprobs)
    assert [len(t.token_ids) for t in scored.prompt_top_logprobs] == [2] * len(PROMPT)
    # the appended token scores as it did when it was generated
    assert scored.prompt_logprobs[-1] == pytest.approx(logprob, abs=2e-2)
    assert not scored.prompt_token_ids, "ids the caller sent are not echoed"
    assert not gen(stub, prompt_token_ids=PROMPT).prompt_logprobs, "off unless asked"


def _long_request(stub, request_id: str, out: dict, stream: bool) -> threading.Thread:
    sampling = pb.SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)

    def run():
        if stream:
            req = pb.GenerateStreamRequest(
                request_id=request_id, prompt_token_ids=PROMPT, sampling_params=sampling
            )
            out[request_id] = list(stub.GenerateStream(req, timeout=120))
        else:
            req = pb.GenerateRequest(
                request_id=request_id, prompt_token_ids=PROMPT, sampling_params=sampling
            )
            out[request_id] = stub.Generate(req, timeout=120)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_abort_ends_calls_by_id_with_their_partial_tokens(stub):
    out: dict = {}
    threads = [
        _long_request(stub, "ab-unary", out, False),
        _long_request(stub, "ab-stream", out, True),
    ]
    time.sleep(0.5)
    r = stub.Abort(pb.AbortRequest(request_ids=["ab-unary", "ab-stream", "never-seen"]))
    assert sorted(r.request_ids) == ["ab-stream", "ab-unary"]
    for t in threads:
        t.join(60)
    unary = out["ab-unary"].completions[0]
    assert unary.finish_reason == pb.FINISH_REASON_ABORT
    assert 0 < len(unary.token_ids) < 1500 and len(unary.logprobs) == len(unary.token_ids)
    deltas = out["ab-stream"]
    assert deltas[-1].finish_reason == pb.FINISH_REASON_ABORT and deltas[-1].HasField("usage")
    assert 0 < sum(len(d.token_ids) for d in deltas) < 1500
    # the server keeps serving
    assert gen(stub, prompt_token_ids=PROMPT).completions[0].finish_reason


def test_abort_all(stub):
    out: dict = {}
    threads = [_long_request(stub, f"all-{i}", out, i % 2 == 0) for i in range(3)]
    time.sleep(0.5)
    assert sorted(stub.Abort(pb.AbortRequest(all=True)).request_ids) == ["all-0", "all-1", "all-2"]
    for t in threads:
        t.join(60)
    assert out["all-1"].completions[0].finish_reason == pb.FINISH_REASON_ABORT
    assert out["all-0"][-1].finish_reason == pb.FINISH_REASON_ABORT
    assert stub.Abort(pb.AbortRequest(all=True)).request_ids == []


def test_abort_needs_ids_or_all(stub):
    assert "request_ids" in refused(lambda: stub.Abort(pb.AbortRequest()))
    assert "request_ids" in refused(
        lambda: stub.Abort(pb.AbortRequest(request_ids=["a"], all=True))
    )


def _chat(*turns: tuple[str, str]) -> list[pb.ChatMessage]:
    return [pb.ChatMessage(role=r, content=[pb.ContentPart(text=t)]) for r, t in turns]


CHAT = _chat(("system", "You are terse."), ("user", "Name a color."))
CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a color."},
]


def test_chat_messages_render_with_the_models_template(stub, hf_tokenizer):
    expected = hf_tokenizer.apply_chat_template(
        CONV, tokenize=True, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    chat = gen(stub, messages=CHAT)
    assert list(chat.prompt_token_ids) == expected
    same = gen(stub, prompt_token_ids=expected)
    assert list(chat.completions[0].token_ids) == list(same.completions[0].token_ids)
    tokenized = stub.Tokenize(pb.TokenizeRequest(messages=CHAT))
    assert list(tokenized.token_ids) == expected
    assert tokenized.text == hf_tokenizer.apply_chat_template(
        CONV, tokenize=False, add_generation_prompt=True
    )
    # continuing the assistant's own message instead of opening a new one
    cont = _chat(*[(m["role"], m["content"]) for m in CONV], ("assistant", "Blue and"))
    open_ids = stub.Tokenize(
        pb.TokenizeRequest(messages=cont, chat_options=pb.ChatOptions(continue_final_message=True))
    )
    assert open_ids.text.endswith("Blue and")


def test_bad_chat_requests_name_the_field(stub):
    assert "exactly one" in refused(lambda: gen(stub, messages=CHAT, prompt_text="hi"))
    no_role = [pb.ChatMessage(content=[pb.ContentPart(text="x")])]
    assert refused(lambda: gen(stub, messages=no_role)).startswith("messages[0].role")
    empty_part = [pb.ChatMessage(role="user", content=[pb.ContentPart()])]
    assert refused(lambda: gen(stub, messages=empty_part)).startswith("messages[0].content[0]")
    image = [pb.ChatMessage(role="user", content=[pb.ContentPart(image=pb.Image(data=b"x"))])]
    assert "text-only" in refused(lambda: gen(stub, messages=image))
    opts = pb.ChatOptions(continue_final_message=True)
    assert refused(lambda: gen(stub, messages=CHAT, chat_options=opts)).startswith(
        "chat_options.continue_final_message"
    )
    assert refused(lambda: gen(stub, prompt_text="hi", chat_options=opts)).startswith(
        "chat_options"
    )


def test_tokenize_and_detokenize_round_trip(stub, hf_tokenizer):
    text = "The store opens at nine."
    ids = list(stub.Tokenize(pb.TokenizeRequest(text=text)).token_ids)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False) or ids == hf_tokenizer.encode(
        text
    )
    assert stub.Detokenize(pb.DetokenizeRequest(token_ids=ids)).text == text
    # Generate tokenizes prompt_text the same way, and says so
    assert list(gen(stub, prompt_text=text).prompt_token_ids) == ids
    eos = hf_tokenizer.eos_token_id
    with_eos = [*ids, eos]
    assert stub.Detokenize(pb.DetokenizeRequest(token_ids=with_eos)).text != text
    skipped = stub.Detokenize(pb.DetokenizeRequest(token_ids=with_eos, skip_special_tokens=True))
    assert skipped.text == text
    assert refused(lambda: stub.Detokenize(pb.DetokenizeRequest(token_ids=[1, 10**6]))).startswith(
        "token_ids[1]"
    )
    assert "exactly one" in refused(lambda: stub.Tokenize(pb.TokenizeRequest()))


def test_server_info_gives_the_tokenizers_facts(info, hf_tokenizer):
    t = info.tokenizer
    assert hf_tokenizer.eos_token_id in t.eos_token_ids
    assert t.bos_token_id == hf_tokenizer.bos_token_id
    assert t.pad_token_id == hf_tokenizer.pad_token_id
    assert t.has_chat_template
    assert t.image_placeholder == "" and not t.HasField("image_token_id")  # a text model


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_structured_outputs_constrain_what_a_random_model_says(stub, seed):
    choice = constrained(
        stub, seed, choice=pb.StructuredOutput.Choices(choices=["alpha", "beta", "gamma"])
    )
    assert choice.text in {"alpha", "beta", "gamma"}
    regex = constrained(stub, seed, regex=r"[a-c]{2,4}-[0-9]{2}")
    assert re.fullmatch(r"[a-c]{2,4}-[0-9]{2}", regex.text), regex.text
    # JSON schemas: tests/engine/generation/test_engine_options.py (a weak model pads JSON with
    # whitespace unless the engine's structured-outputs config forbids it)


def test_unconstrained_output_is_not_like_that(stub):
    # the same seeds without a constraint: the checks above are not vacuous
    free = [
        gen(stub, prompt_text="Answer:", sampling={"max_tokens": 20, "seed": s, "temperature": 1.0})
        for s in (1, 2, 3)
    ]
    texts = [f.completions[0].text for f in free]
    assert not any(re.fullmatch(r"[a-c]{2,4}-[0-9]{2}", t) for t in texts)
    assert not any(t in {"alpha", "beta", "gamma"} for t in texts)


def test_bad_constraints_are_refused_with_the_field(stub):
    so = "sampling_params.structured_output"
    cases = {
        f"{so}.json_schema": pb.StructuredOutput(json_schema="{not json"),
        f"{so}.regex": pb.StructuredOutput(regex="(unclosed"),
        f"{so}.choice.choices": pb.StructuredOutput(choice=pb.StructuredOutput.Choices()),
    }
    for field, constraint in cases.items():
        details = refused(
            lambda c=constraint: gen(stub, prompt_text="x", sampling={"structured_output": c})
        )
        assert details.startswith(field), details


def test_sleep_is_refused_where_the_platform_has_none(stub, info):
    assert not info.supports_sleep and not info.sleeping
    details = refused(
        lambda: stub.Sleep(pb.SleepRequest(level=1)), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert "sleep mode" in details and "cpu" in details
    refused(lambda: stub.WakeUp(pb.WakeUpRequest()), grpc.StatusCode.FAILED_PRECONDITION)
    assert gen(stub, prompt_token_ids=PROMPT).completions[0].token_ids  # still serving
