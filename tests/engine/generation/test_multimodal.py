"""Images on the embedded tiny LLaVA, over gRPC and in OpenAI chat messages
over the HTTP front (data: URLs, the same tokens as gRPC; no URL fetched,
hostile images refused naming the part), and staleness after a vision-only
update."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import grpc
import httpx
import openai
import pytest
from PIL import Image

from harness.weights_util import checkpoint_tensors, random_weights, version
from rollout_client import RolloutClient, RolloutError
from rollout_service.engine.tiny_models import ensure_model
from tests.support.images import png_of

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


def test_a_lossless_webp_is_the_same_picture_as_its_png(llava):
    _, c = llava
    buf = io.BytesIO()
    Image.open(io.BytesIO(png(1))).save(buf, format="WEBP", lossless=True)
    assert greedy(c, buf.getvalue())[:2] == greedy(c, png(1))[:2]


@pytest.mark.parametrize(
    ("images", "words"),
    [
        ([b"not an image"], "images[0].data: is not a PNG, JPEG or WebP image"),
        # A decompression bomb by its header (PIL's own check: over 179M pixels).
        ([png_of(20000, 20000)], "images[0].data: is over the pixels an image may hold"),
        # Under PIL's check, over the request's budget (generation/images.py).
        ([png_of(4096, 4096), png_of(4096, 4097)], "images[1].data: is 4096x4097 pixels"),
    ],
)
def test_bad_images_are_rejected(llava, images, words):
    _, c = llava
    with pytest.raises(RolloutError) as e:
        c.generate(prompt_text=PROMPT, images=images, max_tokens=4)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details
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


def data_url(image: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(image).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def bomb() -> bytes:
    """A PNG of 8192 x 8192 zero pixels (64M) in about 65 KB."""
    return png_of(8192, 8192, b"\x00" * (8193 * 8192))


@pytest.fixture(scope="module")
def agent(llava_server):
    """The official SDK on the llava server's HTTP front, and its model's name."""
    with openai.OpenAI(
        base_url=f"http://{llava_server.http_target}/v1",
        api_key="unused-without-auth",
        max_retries=0,
        timeout=120,
    ) as sdk:
        yield sdk, sdk.models.list().data[0].id


def test_http_chat_images_are_grpc_chat_images(llava, agent):
    """Data: URLs in OpenAI image_url parts reach the engine as the same
    images in gRPC chat messages do: greedy, the same token ids and logprobs,
    the same prompt ids (each placeholder expanded by the processor), for a
    PNG, a JPEG and two images in one message, streamed or not; prompt
    logprobs over the expanded prompt too."""
    from rollout_client import pb

    _, client = llava
    sdk, model = agent
    cases = [
        [(png(7), "image/png"), " What is it?"],
        [(jpeg_red(), "image/jpeg"), " And this?"],
        ["Two: ", (png(1), "image/png"), " and ", (jpeg_red(), "image/jpeg")],
    ]
    for parts in cases:
        openai_parts = [
            image_part(data_url(*p)) if isinstance(p, tuple) else {"type": "text", "text": p}
            for p in parts
        ]
        grpc_parts = [
            pb.ContentPart(image=pb.Image(data=p[0]))
            if isinstance(p, tuple)
            else pb.ContentPart(text=p)
            for p in parts
        ]
        want = client.stub.Generate(
            pb.GenerateRequest(
                messages=[pb.ChatMessage(role="user", content=grpc_parts)],
                sampling_params=pb.SamplingParams(max_tokens=12, temperature=0, prompt_logprobs=1),
            ),
            timeout=120,
        )
        [w] = want.completions
        messages = [{"role": "user", "content": openai_parts}]
        extra = {"return_token_ids": True, "prompt_logprobs": 1}
        chat = sdk.chat.completions.create(
            model=model, messages=messages, max_tokens=12, temperature=0, logprobs=True,
            extra_body=extra,
        )  # fmt: skip
        [choice] = chat.choices
        assert choice.model_extra["token_ids"] == list(w.token_ids)
        got = [t.logprob for t in choice.logprobs.content]
        assert got == pytest.approx(list(w.logprobs), abs=1e-5)
        prompt_ids = chat.model_extra["prompt_token_ids"]
        assert prompt_ids == list(want.prompt_token_ids)
        assert client.server_info().tokenizer.image_token_id in prompt_ids
        assert chat.usage.prompt_tokens == len(prompt_ids)
        first, *rest = chat.model_extra["prompt_logprobs"]
        assert first is None
        got = [entry[str(i)]["logprob"] for entry, i in zip(rest, prompt_ids[1:], strict=True)]
        assert got == pytest.approx(list(want.prompt_logprobs), abs=1e-5)

        chunks = list(
            sdk.chat.completions.create(
                model=model, messages=messages, max_tokens=12, temperature=0, stream=True,
                extra_body={"return_token_ids": True},
            )
        )  # fmt: skip
        assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
        streamed = [
            t for c in chunks for ch in c.choices for t in ch.model_extra.get("token_ids") or []
        ]
        assert streamed == list(w.token_ids)


class _Listener(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):
        _Listener.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(png(1))

    def log_message(self, *args):
        pass


def test_http_image_refusals_name_the_part(llava, agent, server):
    """No URL is fetched (a listener the request names sees no request), and
    every image past a limit is refused 400 naming its part, before any work:
    remote and file URLs, a malformed data: URL, bytes that are no image, a
    payload over the bytes an image may hold, a decompression bomb, more
    images than the engine takes a prompt. A text-only model refuses the
    part; a session's URL refuses it (sessions take text only, as gRPC's
    do). The server serves images after all of it."""
    llava_proc, _ = llava
    sdk, model = agent
    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    remote = f"http://127.0.0.1:{listener.server_address[1]}/cat.png"
    field = "messages[1].content[0].image_url"
    refused = [
        (remote, "fetches no URL"),
        ("https://example.com/cat.png", "fetches no URL"),
        ("file:///etc/passwd", "fetches no URL"),
        ("data:image/png,not-base64", "not a data: URL in base64"),
        (data_url(b"%PDF-1.4 not an image"), "not a PNG, JPEG or WebP image"),
        ("data:image/png;base64," + "A" * (12 << 20), "bytes, the most an image may"),
        (data_url(bomb()), "pixels in all"),
    ]

    def ask(parts, to=sdk, name=model):
        return to.chat.completions.create(
            model=name,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": parts},
            ],
            max_tokens=4,
        )

    try:
        for url, words in refused:
            with pytest.raises(openai.BadRequestError) as e:
                ask([image_part(url), {"type": "text", "text": " What is it?"}])
            assert e.value.status_code == 400 and e.value.body["param"] == field, e.value.body
            assert words in e.value.body["message"], e.value.body
        assert _Listener.hits == []
    finally:
        listener.shutdown()
        listener.server_close()

    # vLLM's default limit a prompt (the engine's: a gRPC request of more is refused too).
    many = [image_part("data:,") for _ in range(1000)]
    with pytest.raises(openai.BadRequestError) as e:
        ask(many)
    assert e.value.body["param"] == "messages[1].content[999].image_url", e.value.body
    assert "at most 999 images" in e.value.body["message"]

    with openai.OpenAI(
        base_url=f"http://{server.http_target}/v1", api_key="x", max_retries=0, timeout=120
    ) as text_only:
        with pytest.raises(openai.BadRequestError) as e:
            ask([image_part(data_url(png(1)))], text_only, "tiny-qwen2")
    assert e.value.body["param"] == "messages[1].content[0]", e.value.body
    assert "text-only" in e.value.body["message"]

    opened = httpx.post(
        f"http://{llava_proc.http_target}/sessions",
        json={"messages": [{"role": "system", "content": "Be brief."}]},
        timeout=120,
    ).json()
    with openai.OpenAI(base_url=opened["base_url"], api_key="x", max_retries=0) as session:
        with pytest.raises(openai.BadRequestError) as e:
            ask([image_part(data_url(png(1)))], session)
    assert e.value.body["param"] == "messages[1].content[0]", e.value.body
    assert "text parts only" in e.value.body["message"]

    fine = ask([image_part(data_url(png(1))), {"type": "text", "text": " What is it?"}])
    assert fine.choices[0].finish_reason in ("stop", "length")
