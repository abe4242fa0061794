"""Images on the embedded tiny LLaVA, and staleness after a vision-only update."""

from __future__ import annotations

import io

import grpc
import pytest
from PIL import Image

from harness.weights_util import checkpoint_tensors, random_weights, version
from rollout_client import RolloutClient, RolloutError
from rollout_service.engine.tiny_models import ensure_model

PROMPT = "<image> Describe the picture in one sentence."


def png(seed: int) -> bytes:
    import random

    rng = random.Random(seed)
    img = Image.new("RGB", (32, 32))
    img.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(1024)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def jpeg_red() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), (220, 10, 10)).save(buf, format="JPEG")
    return buf.getvalue()


def greedy(client, image: bytes):
    r = client.generate(prompt_text=PROMPT, images=[image], max_tokens=12, temperature=0)
    c = r.completions[0]
    return list(c.token_ids), list(c.logprobs), r


@pytest.fixture(scope="module")
def llava(llava_server):
    with RolloutClient(llava_server.target, timeout=120) as c:
        yield llava_server, c


def test_images_change_the_output(llava):
    _, c = llava
    assert c.server_info().supports_images
    a, b = greedy(c, png(1))[:2], greedy(c, jpeg_red())[:2]
    assert a != b
    assert greedy(c, png(1))[:2] == a  # deterministic


def test_bad_images_are_rejected(llava):
    _, c = llava
    with pytest.raises(RolloutError) as e:
        c.generate(prompt_text=PROMPT, images=[b"not an image"], max_tokens=4)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "images[0]" in e.value.details
    assert greedy(c, png(1))[0]


def test_vision_only_update_is_never_stale(llava):
    """A vision-only update, both ways, with the encoder and multimodal
    caches warm: to new vision weights (the output changes at once), and back
    to the checkpoint's, after which the output is exactly what this engine
    served before any update, i.e. what a fresh engine on those weights
    serves. Stale image embeddings would show in either direction."""
    _, c = llava
    image = png(2)
    fresh = greedy(c, image)[:2]  # no update has run on this engine yet
    assert greedy(c, image)[:2] == fresh  # served again (encoder/mm caches warm)
    info = c.server_info()
    vision = [
        p for p in info.parameters if p.name.startswith(("vision_tower.", "multi_modal_projector."))
    ]
    assert vision and len(vision) < len(info.parameters)
    ack = c.update_weights(random_weights(vision, seed=5), version())
    assert ack.tensors_loaded == len(vision)
    tokens, logprobs, r = greedy(c, image)
    assert r.weight_version == ack.weight_version
    assert (tokens, logprobs) != fresh

    names = {p.name for p in vision}
    original = {
        n: t for n, t in checkpoint_tensors(ensure_model("tiny-llava")).items() if n in names
    }
    assert original.keys() == names
    back = c.update_weights(original, version())
    assert back.tensors_loaded == len(vision)
    tokens, logprobs, r = greedy(c, image)
    assert r.weight_version == back.weight_version
    assert tokens == fresh[0]
    assert logprobs == pytest.approx(fresh[1], abs=1e-6)


def test_chat_messages_carry_images_to_the_placeholder(llava):
    from rollout_client import pb

    _, client = llava
    info = client.server_info()
    assert info.tokenizer.image_placeholder == "<image>" and info.tokenizer.HasField(
        "image_token_id"
    )
    image = png(7)
    msg = pb.ChatMessage(
        role="user",
        content=[pb.ContentPart(image=pb.Image(data=image)), pb.ContentPart(text=" What is it?")],
    )
    chat = client.stub.Generate(
        pb.GenerateRequest(
            messages=[msg], sampling_params=pb.SamplingParams(max_tokens=12, temperature=0)
        ),
        timeout=120,
    )
    rendered = "<|user|>\n<image> What is it?<|endoftext|>\n<|assistant|>\n"
    text = client.generate(prompt_text=rendered, images=[image], max_tokens=12, temperature=0)
    assert list(chat.completions[0].token_ids) == list(text.completions[0].token_ids)
    assert info.tokenizer.image_token_id in chat.prompt_token_ids


def test_keep_mode_is_refused_on_a_multimodal_model(llava):
    from rollout_client import pb

    _, client = llava
    info = client.server_info()
    before = greedy(client, png(3))[0]
    weights = random_weights(info.parameters[:1], seed=9)
    with pytest.raises(RolloutError) as e:
        client.update_weights(weights, version(), pause_mode=pb.PAUSE_MODE_KEEP)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "begin.pause_mode" in e.value.details and "multimodal" in e.value.details
    assert greedy(client, png(3))[0] == before
