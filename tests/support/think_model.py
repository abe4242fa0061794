"""A tiny Qwen2 that thinks, for the reasoning parser's tests (conftest's
`reasoning_server`): tiny-qwen2's tokenizer with `<think>`, `</think>`,
`<tool_call>`, `</tool_call>` and one tool call's JSON added as tokens (not
special: the text keeps them, as Qwen3's and DeepSeek-R1's tokenizers keep
theirs), a chat template whose generation prompt opens `<think>` (as
DeepSeek-R1's does), and weights set by hand so that greedy decoding
follows one chain whatever the prompt:

    ... <think> | The rain </think> river green <tool_call> {json} </tool_call> <eos>

A random model would never emit the think tokens. Here every layer's output
projections are zero, so the hidden state is the current token's embedding:
each token of the chain has an embedding of its own (a unit vector) whose
lm_head row points at its successor; every other token (the prompt's last,
`<think>`) shares the chain's first. Each step's logit gap is about 90.
"""

from __future__ import annotations

from pathlib import Path

from rollout_service.engine.tiny_models import ensure_model

THINK, END_THINK = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
CALL_JSON = '{"name": "get_time", "arguments": {"zone": "utc"}}'
# Single tokens of tiny-qwen2's trained vocabulary.
REASONING_WORDS = ("The", " rain")
CONTENT_WORDS = (" river", " green")
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n<think>{% endif %}"
)
_GAIN = 8.0


def chain_ids(tok) -> list[int]:
    """The chain's token ids after the prompt, in order, ending at EOS."""

    def one(text: str) -> int:
        [i] = tok.encode(text, add_special_tokens=False)
        return i

    words = [*REASONING_WORDS, END_THINK, *CONTENT_WORDS, TOOL_OPEN, CALL_JSON, TOOL_CLOSE]
    return [one(w) for w in words] + [tok.eos_token_id]


def build_think_model(dest: Path) -> Path:
    """The model and tokenizer into `dest` (float32)."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    src = ensure_model("tiny-qwen2")
    tok = AutoTokenizer.from_pretrained(src)
    added = [THINK, END_THINK, TOOL_OPEN, TOOL_CLOSE, CALL_JSON]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tok.chat_template = TEMPLATE
    chain = chain_ids(tok)
    config = Qwen2Config.from_pretrained(src)
    config.vocab_size = -(-len(tok) // 64) * 64
    config.dtype = torch.float32
    model = Qwen2ForCausalLM(config).to(torch.float32)
    hidden = config.hidden_size
    sources = chain[:-1]  # slot k's token is followed by chain[k]; slot 0 is every other token
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        embed[:, 0] = 1.0
        for slot, token in enumerate(sources, start=1):
            embed[token] = 0.0
            embed[token, slot] = 1.0
        for slot, nxt in enumerate(chain):
            head[nxt, slot] = _GAIN
    assert len(chain) < hidden
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    eos = tok.eos_token_id
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(dest)
    return dest
