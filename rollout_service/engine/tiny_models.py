"""Tiny random-weight checkpoints built locally, so tests and demos need no model hub.

Both models are built deterministically (fixed seeds, a tokenizer trained on a fixed
built-in corpus) and are small enough to start a vLLM engine on a 2-core CPU in seconds.
The sizes follow what is known to work with vLLM's CPU backend: head_dim 64 (head_dim 16
is rejected by CPU attention), bf16 weights, untied lm_head so it can be updated on its own.
Weights are re-drawn with std 0.08 on matrices (HF uses 0.02): larger logit gaps, so greedy
output clearly depends on the prompt and the image and does not hinge on bf16 rounding, which
is what staleness tests (old vs new weights, old vs new image) need.

Public API: ``EMBEDDED_MODELS``, ``DEFAULT_MODEL``, ``build_tiny_qwen2``,
``build_tiny_llava``, ``ensure_model``, ``install_pixtral_alias``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

VOCAB_SIZE = 512
EOS = "<|endoftext|>"
IMAGE_TOKEN = "<image>"
MODEL_VERSION = "v1"  # bump when the recipe changes, so stale caches are not reused

# Used only to train the BPE merges; any fixed English text would do.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A rollout service generates text with the newest policy weights.",
    "Every request is answered by the model that is loaded right now.",
    "The cat sat on the warm mat and watched the rain fall outside.",
    "She opened the window and the cold morning air filled the room.",
    "Numbers like one, two, three and four are easy to count.",
    "He wrote a short letter to his friend who lives by the sea.",
    "The red ball rolled down the hill and stopped near the green tree.",
    "Machine learning models learn patterns from large amounts of data.",
    "Please describe the picture in one short sentence.",
    "The image shows a bright red square on a plain background.",
    "There is a small blue bird sitting on the branch of an old oak.",
    "We walked along the river until the sun went down behind the hills.",
    "Reinforcement learning updates a policy using rewards from the environment.",
    "The teacher asked the students to read the first chapter again.",
    "Water boils at one hundred degrees at sea level.",
    "In the evening the city lights shine like stars on the water.",
    "A good answer is short, clear and correct.",
    "The train leaves the station at seven in the morning every day.",
    "They planted tomatoes, beans and carrots in the garden this spring.",
    "What is the capital of France? The capital of France is Paris.",
    "Write a poem about the moon, the night and the quiet sea.",
    "The dog barked at the mailman and then ran back into the house.",
    "Cache entries must be cleared after the weights are changed.",
    "Hello world! How are you today? I am fine, thank you.",
    "The library was quiet except for the sound of turning pages.",
    "Colors of the rainbow are red, orange, yellow, green, blue and violet.",
    "Small models are fast to load and easy to test on a laptop.",
    "The old man told stories about the mountains where he grew up.",
    "Fresh bread from the bakery smells wonderful in the early morning.",
    "The children laughed and played in the park until it was dark.",
    "Server, client, request, response, stream, token, model, weight.",
    "A noisy picture has random pixels of many different colors.",
    "Knowledge grows when people share what they have learned.",
    "The store opens at nine and closes at six on weekdays.",
    "Mountains, rivers, forests and deserts cover the face of the earth.",
]

# Minimal ChatML-like template; image parts render as the <image> placeholder.
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _build_tokenizer(extra_special: list[str]):
    """Train a byte-level BPE (vocab <= VOCAB_SIZE, specials included) on _CORPUS.

    Byte-level means any text encodes (no unknown tokens). Special tokens get the lowest ids:
    EOS is 0 and doubles as bos/pad; extra specials (``<image>``) follow.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS, *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        extra_special_tokens=extra_special or None,
    )
    fast.chat_template = _CHAT_TEMPLATE
    assert len(fast) <= VOCAB_SIZE, len(fast)
    return fast


def _never_emit(tok) -> list[int]:
    """Ids whose lm_head rows get zeroed: special tokens and tokens that do not decode to
    printable ASCII (lone bytes >= 0x80, control bytes)."""
    return [
        i
        for i in range(len(tok))
        if i in tok.all_special_ids or not (s := tok.decode([i])).isascii() or not s.isprintable()
    ]


def _randomize(model, never_emit: list[int], std: float = 0.08) -> None:
    """Re-draw weights (seeded by the caller): N(0, std) for matrices, small biases, norms
    left at 1. Large enough that outputs depend visibly on the prompt and the image.

    The lm_head rows of ``never_emit`` are zeroed: their logit is then exactly 0 while the
    largest random logit is positive, so greedy decoding never stops early at EOS (tests get
    exactly ``max_tokens`` tokens), never emits ``<image>``, and its text is printable ASCII
    (no half UTF-8 sequences, which make decoded text empty or U+FFFD). Sampling at
    temperature > 0 can still pick them.
    """
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02)
        model.get_output_embeddings().weight[never_emit] = 0.0


def _text_kwargs(eos_id: int) -> dict:
    return dict(
        hidden_size=128,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=256,
        num_key_value_heads=1,  # head_dim 64: the smallest the CPU attention kernel takes
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=2048,
        tie_word_embeddings=False,  # lm_head is its own tensor, so it can be updated alone
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def _save_generation_config(path: Path, eos_id: int) -> None:
    from transformers import GenerationConfig

    ids = dict(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    GenerationConfig(**ids).save_pretrained(path)


def build_tiny_qwen2(path: Path) -> Path:
    """Build a ~0.4 M-parameter Qwen2 (hidden 128, 2 layers, vocab 512, bf16) into ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer([])
    eos_id = tok.eos_token_id
    config = Qwen2Config(**_text_kwargs(eos_id))
    config.dtype = torch.bfloat16
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    _randomize(model, _never_emit(tok))
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    _save_generation_config(path, eos_id)
    return path


def _rename_clip_keys(path: Path) -> None:
    """transformers 5 saves the CLIP tower as ``vision_tower.embeddings...`` (legacy layout,
    ``model.`` prefix-free); vLLM's CLIPVisionModel nests it one level deeper, as
    ``vision_tower.vision_model.embeddings...``, and its llava weight mapper does not add that
    level. Rewrite the saved keys to the nested form (weight updates must use it too)."""
    from safetensors.torch import load_file, save_file

    files = sorted(path.glob("*.safetensors"))
    assert len(files) == 1, files  # tiny model: never sharded, so no index file to patch
    renamed = {}
    for key, tensor in load_file(files[0]).items():
        head, sep, rest = key.partition("vision_tower.")
        if sep and head in ("", "model.") and not rest.startswith("vision_model."):
            key = f"{head}vision_tower.vision_model.{rest}"
        renamed[key] = tensor
    save_file(renamed, files[0], metadata={"format": "pt"})


def build_tiny_llava(path: Path) -> Path:
    """Build a tiny LLaVA (CLIP 32x32 px, patch 8 + Llama like the Qwen2 above) into ``path``.

    Each image becomes 16 ``<image>`` tokens (4x4 patches; the CLS token is dropped by the
    "default" feature-select strategy). The image processor is the PIL one, so nothing needs
    torchvision. Prompts are raw text containing one ``<image>`` per image.
    """
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer([IMAGE_TOKEN])
    eos_id = tok.eos_token_id
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    vision = CLIPVisionConfig(
        image_size=32,
        patch_size=8,
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=2,
        num_hidden_layers=2,
        projection_dim=128,
    )
    text = LlamaConfig(**_text_kwargs(eos_id))
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_id,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,  # use every vision layer, so every saved tensor is loaded
        image_seq_length=16,  # (32 / 8) ** 2 patches; the default 576 is for 336 px CLIP
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    config.dtype = torch.bfloat16
    # Typed `dict | PreTrainedConfig | None`: LlavaConfig keeps the config object it was given.
    assert isinstance(config.text_config, LlamaConfig)
    config.text_config.dtype = torch.bfloat16
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    _randomize(model, _never_emit(tok))
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    _rename_clip_keys(path)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLIP's CLS token
        chat_template=_CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    _save_generation_config(path, eos_id)
    return path


_BUILDERS = {"tiny-qwen2": build_tiny_qwen2, "tiny-llava": build_tiny_llava}
# The names `--model` takes besides a checkpoint folder, and the one served without it.
EMBEDDED_MODELS = tuple(_BUILDERS)
DEFAULT_MODEL = "tiny-qwen2"


def ensure_model(name: str, cache_dir: Path | None = None) -> Path:
    """Return the directory of model ``name``, building it on first use.

    The directory is ``<root>/<name>-v1`` where root is ``cache_dir``, else
    ``$ROLLOUT_SERVICE_CACHE``, else ``~/.cache/rollout-service/models``. The build goes into
    a temp dir beside it and is renamed into place, so a directory that exists is complete; if
    another process wins the race, its copy is used and ours is discarded.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(EMBEDDED_MODELS)}")
    root = Path(
        cache_dir
        or os.environ.get("ROLLOUT_SERVICE_CACHE")
        or Path.home() / ".cache" / "rollout-service" / "models"
    )
    final = root.expanduser() / f"{name}-{MODEL_VERSION}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache may be shared
    log.info("building the embedded model %s into %s (first run only)", name, final)
    try:
        _build_apart(name, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():
                raise  # not a lost race: something else is in the way
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_apart(name: str, folder: Path) -> None:
    """Builds in a process of its own (spawned: imports torch and
    transformers again, on the first run only). Building runs torch's
    parallel kernels, whose OpenMP threads do not survive a fork: a server
    that built in-process and then forked its engine core (core_fork.py)
    would leave that engine's workers waiting on threads that are gone."""
    import multiprocessing

    p = multiprocessing.get_context("spawn").Process(target=_BUILDERS[name], args=(folder,))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"building the embedded model {name} failed (exit code {p.exitcode})")


def install_pixtral_alias() -> None:
    """Let vLLM's llava module import without torchvision (which we do not install).

    vLLM's llava imports its pixtral module, which imports
    ``transformers.models.pixtral.image_processing_pixtral``; that module needs torchvision.
    Its PIL twin ``image_processing_pil_pixtral`` defines the same helper vLLM uses
    (``_num_image_tokens``), so registering it under the torchvision module's name makes the
    import succeed. No-op if torchvision is installed or the name is already taken.

    It must run in every process that imports llava, including the one vLLM's model registry
    starts (``python -m vllm.model_executor.models.registry``) to inspect the architecture
    on a cold cache. That process runs only the ``vllm.general_plugins`` entry points, which
    is why the plugin hook (worker/plugins.py) calls this.
    """
    import importlib
    import importlib.util

    target = "transformers.models.pixtral.image_processing_pixtral"
    if target not in sys.modules and importlib.util.find_spec("torchvision") is None:
        sys.modules[target] = importlib.import_module(
            "transformers.models.pixtral.image_processing_pil_pixtral"
        )
