"""Request validation and conversion alone (no engine): the contract's static
rules (status/static_rules.py), then what convert.py checks against the model."""

from __future__ import annotations

import math

import pytest
from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation.convert import (
    ModelLimits,
    prompt_from_request,
    sampling_params_from_proto,
)
from rollout_service.status import static_rules
from rollout_service.status.errors import InvalidArgument

LIMITS = ModelLimits(vocab_size=100, max_model_len=64, max_logprobs=5, supports_images=False)


def params(**kw):
    """As the pipeline converts: the contract's rules first, then the model's."""
    sp = pb.SamplingParams(**kw)
    static_rules.check(pb.GenerateRequest(sampling_params=sp))
    return sampling_params_from_proto(
        sp, LIMITS, prompt_tokens=10, output_kind=RequestOutputKind.FINAL_ONLY
    )


def test_every_field_reaches_vllm():
    sp = params(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=3,
        min_p=0.1,
        seed=42,
        n=2,
        logprobs=4,
        stop=["x"],
        stop_token_ids=[5],
        ignore_eos=True,
        repetition_penalty=1.1,
        presence_penalty=0.2,
        frequency_penalty=-0.3,
        min_tokens=2,
    )
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k) == (7, 0.5, pytest.approx(0.9), 3)
    assert (sp.min_p, sp.seed, sp.n, sp.logprobs) == (pytest.approx(0.1), 42, 2, 4)
    assert sp.stop == ["x"] and 5 in sp.stop_token_ids and sp.ignore_eos
    assert sp.repetition_penalty == pytest.approx(1.1)
    assert sp.presence_penalty == pytest.approx(0.2)
    assert sp.frequency_penalty == pytest.approx(-0.3)
    assert sp.min_tokens == 2


def test_defaults_fill_the_context_and_always_return_logprobs():
    sp = params()
    assert sp.max_tokens == 64 - 10 and sp.n == 1 and sp.temperature == 1.0
    assert sp.logprobs == 0  # the sampled token's logprob


def test_zero_is_meaningful_where_optional():
    assert params(temperature=0.0).temperature == 0.0
    assert params(top_k=0).top_k == 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 55}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"n": 0}, "n"),
        ({"logprobs": 6}, "logprobs"),
        ({"stop_token_ids": [100]}, "stop_token_ids[0]"),
        ({"stop": ["ok", ""]}, "stop[1]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -math.inf}, "frequency_penalty"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ],
)
def test_bad_sampling_values_name_the_field(kw, field):
    with pytest.raises(InvalidArgument) as e:
        params(**kw)
    assert e.value.field == "sampling_params." + field


@pytest.mark.parametrize(
    ("message", "prefix", "expected"),
    [
        # Every rule the first field breaks, with its value.
        (
            pb.SamplingParams(temperature=math.nan, top_p=2),
            "sampling_params",
            "sampling_params.temperature: must be greater than or equal to 0; "
            "must be finite, got nan",
        ),
        (
            pb.GenerateRequest(messages=[pb.ChatMessage(role="u"), pb.ChatMessage()]),
            "",
            "messages[1].role: must be at least 1 characters, got ''",
        ),
        (
            pb.GenerateRequest(messages=[pb.ChatMessage(role="u", content=[pb.ContentPart()])]),
            "",
            "messages[0].content[0].part: exactly one field is required in oneof",
        ),
        (
            pb.UpdateWeightsBegin(weight_version="v", pause_mode=9),
            "begin",
            "begin.pause_mode: value must be one of the defined enum values, got 9",
        ),
        (
            pb.SleepRequest(level=3),
            "",
            "level: must be greater than or equal to 1 and less than or equal to 2, got 3",
        ),
        (
            pb.SamplingParams(allowed_token_ids=[4, 4]),
            "sampling_params",
            "sampling_params.allowed_token_ids: repeated value must contain unique items",
        ),
    ],
)
def test_the_contracts_rules_name_the_field_as_the_server_does(message, prefix, expected):
    with pytest.raises(InvalidArgument) as e:
        static_rules.check(message, prefix)
    assert str(e.value) == expected


def test_a_request_within_the_rules_passes_and_unset_fields_take_no_rule():
    static_rules.check(pb.GenerateRequest(prompt_token_ids=[1]))
    static_rules.check(
        pb.SamplingParams(max_tokens=1, temperature=0, top_k=-1, stop=["x"]), "sampling_params"
    )


class FakeTokenizing:
    """tokenizing.Tokenizing's surface, over a character-code tokenizer."""

    def encode(self, text, field_name, add_special_tokens=True):
        return [ord(c) % 100 for c in text]

    def min_tokens(self, chars):
        return chars  # one token per character, exactly


class NeverEncodes(FakeTokenizing):
    def encode(self, text, field_name, add_special_tokens=True):
        raise AssertionError("tokenized a text the bound refuses")

    def min_tokens(self, chars):
        return chars // 4  # a token covers at most 4 characters


tok = FakeTokenizing()
PROMPT = "prompt_token_ids/prompt_text/messages"


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (pb.GenerateRequest(), PROMPT),
        (pb.GenerateRequest(prompt_text="a", prompt_token_ids=[1]), PROMPT),
        (pb.GenerateRequest(messages=[pb.ChatMessage(role="user")], prompt_text="a"), PROMPT),
        (pb.GenerateRequest(prompt_token_ids=[1, 100]), "prompt_token_ids[1]"),
        (pb.GenerateRequest(prompt_token_ids=[1] * 64), "prompt_token_ids"),
        (pb.GenerateRequest(prompt_text="x", images=[pb.Image(data=b"png")]), "images"),
    ],
)
def test_bad_prompts_name_the_field(req, field):
    with pytest.raises(InvalidArgument) as e:
        prompt_from_request(req, LIMITS, tok)
    assert e.value.field == field


def test_text_is_tokenized_by_the_server():
    p = prompt_from_request(pb.GenerateRequest(prompt_text="hi"), LIMITS, tok)
    assert p.prompt == {"prompt_token_ids": [ord("h") % 100, ord("i") % 100]} and p.num_tokens == 2
    assert p.echo_ids, "ids the server made are returned to the caller"


def test_a_text_that_cannot_fit_is_refused_before_it_is_tokenized():
    # 256 characters are at least 64 tokens: over max_model_len 64.
    with pytest.raises(InvalidArgument) as e:
        prompt_from_request(pb.GenerateRequest(prompt_text="x" * 256), LIMITS, NeverEncodes())
    assert e.value.field == "prompt_text" and "at least 64 tokens" in e.value.message
    chat = [pb.ChatMessage(role="user", content=[pb.ContentPart(text="x" * 252)])]
    with pytest.raises(InvalidArgument) as e:
        prompt_from_request(pb.GenerateRequest(messages=chat), LIMITS, NeverEncodes())
    assert e.value.field == "messages" and "at least 64 tokens" in e.value.message


def test_images_that_are_not_images():
    limits = ModelLimits(100, 64, 5, supports_images=True)
    req = pb.GenerateRequest(prompt_text="<image>", images=[pb.Image(data=b"GIF89a...")])
    with pytest.raises(InvalidArgument) as e:
        prompt_from_request(req, limits, tok)
    assert e.value.field == "images[0].data"


def stream_params(options: pb.StreamOptions, **kw):
    return sampling_params_from_proto(
        pb.SamplingParams(**kw), LIMITS, 10, RequestOutputKind.DELTA, options
    )


def test_stream_options_reach_vllm():
    default = stream_params(pb.StreamOptions())
    assert default.stream_interval is None and default.detokenize
    tuned = stream_params(pb.StreamOptions(delta_tokens=8, omit_text=True))
    assert tuned.stream_interval == 8 and not tuned.detokenize
    # stop strings are matched on text: vLLM must still detokenize
    assert stream_params(pb.StreamOptions(omit_text=True), stop=["x"]).detokenize
    assert stream_params(pb.StreamOptions(delta_tokens=1)).stream_interval is None
