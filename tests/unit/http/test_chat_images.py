"""Images in chat messages over the HTTP front, without an engine
(rollout_service/http/images.py): data: URLs taken as the bytes a gRPC Image
carries, each part left as an empty placeholder for vLLM's renderer, and
every part or image past a limit refused before any work, naming it."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from rollout_service.generation.images import MAX_PIXELS, checked_pixels
from rollout_service.http.images import MAX_IMAGE_BYTES, take_images
from rollout_service.status.errors import InvalidArgument
from tests.support.images import png_of


def encoded(fmt: str, size=(8, 6), color=(200, 30, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def animated(fmt: str) -> bytes:
    frames = [Image.new("RGB", (8, 6), (60 * i, 30, 40)) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:])
    return buf.getvalue()


def url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_part(u: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": u, **extra}}


def chat(*parts) -> list[dict]:
    """A system message, then a user message of `parts`: its first part is
    messages[1].content[0]."""
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": list(parts)}]


def test_images_are_taken_in_order_and_left_as_placeholders():
    png, jpeg, webp = encoded("PNG"), encoded("JPEG"), encoded("WEBP")
    messages = chat(image_part(url(png)), {"type": "text", "text": " and "})
    messages.append({"role": "user", "content": [image_part(url(jpeg, "image/jpeg"))]})
    messages.append({"role": "user", "content": [image_part(url(webp, "image/webp"))]})
    images = take_images(messages, True, 8)
    assert [i.data for i in images] == [png, jpeg, webp]
    assert messages[1]["content"] == [
        {"type": "image_pil", "image_pil": None},
        {"type": "text", "text": " and "},
    ]
    assert messages[2]["content"] == [{"type": "image_pil", "image_pil": None}]
    assert messages[3]["content"] == [{"type": "image_pil", "image_pil": None}]
    assert messages[0]["content"] == "Be brief."


def test_text_only_chats_are_left_as_they_are():
    messages = chat({"type": "text", "text": "hi"}, "a bare string part")
    before = [dict(m) for m in messages]
    assert take_images(messages, False, 0) == []
    assert messages == before


def test_lazily_validated_content_is_read_once_and_kept():
    """vLLM's request model validates some contents as a one-shot iterator:
    the parts are made a list, so the renderer still sees them."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    png = encoded("PNG")
    body = {"model": "m", "messages": chat(image_part(url(png)), {"type": "text", "text": "x"})}
    request = ChatCompletionRequest.model_validate(body)
    assert [i.data for i in take_images(request.messages, True, 8)] == [png]
    assert request.messages[1]["content"][0] == {"type": "image_pil", "image_pil": None}
    assert request.messages[1]["content"][1]["text"] == "x"

    bad = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    request = ChatCompletionRequest.model_validate(bad)
    with pytest.raises(InvalidArgument) as e:
        take_images(request.messages, True, 8)
    assert e.value.field == "messages[0].content"


FIELD = "messages[1].content[0].image_url"
TOO_BIG = "A" * (4 * -(-MAX_IMAGE_BYTES // 3) + 4)
REFUSED = [
    # (the image_url part's url, the field named, words of the message)
    ("http://127.0.0.1:9/x.png", FIELD, "fetches no URL"),
    ("https://example.com/x.png", FIELD, "fetches no URL"),
    ("file:///etc/passwd", FIELD, "fetches no URL"),
    ("HTTP://example.com/x.png", FIELD, "fetches no URL"),
    ("/etc/passwd", FIELD, "fetches no URL"),
    ("data:image/png,rawbytes", FIELD, "not a data: URL in base64"),
    ("data:image/png;base64", FIELD, "not a data: URL in base64"),
    ("data:text/plain;base64,aGVsbG8=", FIELD, "not an image"),
    ("data:image/png;base64,not*base64", FIELD, "not valid base64"),
    ("data:image/png;base64,QUJD\nREVG", FIELD, "not valid base64"),
    ("data:image/png;base64,", FIELD, "holds no bytes"),
    ("data:image/png;base64," + TOO_BIG, FIELD, f"over {MAX_IMAGE_BYTES} bytes"),
    (url(b"just some text, not an image"), FIELD, "not a PNG, JPEG or WebP image"),
    (url(encoded("GIF"), "image/gif"), FIELD, "not a PNG, JPEG or WebP image"),
    (url(encoded("BMP"), "image/bmp"), FIELD, "not a PNG, JPEG or WebP image"),
    (url(encoded("PNG")[:-20]), FIELD, "not a PNG, JPEG or WebP image ("),
    # One frame: the model would see an animation's first alone.
    (url(animated("WEBP"), "image/webp"), FIELD, "is animated (3 frames)"),
    (url(animated("PNG")), FIELD, "is animated (3 frames)"),
    # A decompression bomb by its header: PIL's own check (over 179M pixels)...
    (url(png_of(20000, 20000)), FIELD, "over the pixels an image may hold"),
    # ... and the request's budget under it.
    (url(png_of(8192, 4097)), FIELD, f"{MAX_PIXELS:,} pixels in all"),
]


@pytest.mark.parametrize(("u", "field", "words"), REFUSED)
def test_hostile_urls_are_refused_naming_the_part(u, field, words):
    with pytest.raises(InvalidArgument) as e:
        take_images(chat(image_part(u)), True, 8)
    assert e.value.field == field and words in e.value.message, e.value.message


def test_a_genuine_bomb_is_refused_from_its_header():
    """64M pixels of zeros in 65 KB: refused before any pixel is decoded."""
    rows = b"".join(b"\x00" * 8193 for _ in range(8192))
    bomb = png_of(8192, 8192, rows)
    assert len(bomb) < 100_000
    with pytest.raises(InvalidArgument) as e:
        take_images(chat(image_part(url(bomb))), True, 8)
    assert e.value.field == FIELD and "pixels in all" in e.value.message


def test_the_pixel_budget_is_the_whole_request_s():
    half = url(png_of(4096, 4096))  # exactly half the budget each
    take_images(chat(image_part(half), image_part(half)), True, 8)
    with pytest.raises(InvalidArgument) as e:
        take_images(
            chat(image_part(half), image_part(half), image_part(url(encoded("PNG")))), True, 8
        )
    assert e.value.field == "messages[1].content[2].image_url" and "0 left" in e.value.message
    assert checked_pixels(encoded("JPEG", (30, 20)), "f", MAX_PIXELS) == 600


def test_detail_other_than_auto_and_a_missing_url_are_refused():
    with pytest.raises(InvalidArgument) as e:
        take_images(chat(image_part(url(encoded("PNG")), detail="low")), True, 8)
    assert e.value.field == FIELD + ".detail"
    take_images(chat(image_part(url(encoded("PNG")), detail="auto")), True, 8)
    with pytest.raises(InvalidArgument) as e:
        take_images(chat({"type": "image_url", "image_url": {}}), True, 8)
    assert e.value.field == FIELD and "needs a url" in e.value.message


@pytest.mark.parametrize(
    "part",
    [
        {"type": "video_url", "video_url": {"url": "http://127.0.0.1:9/v.mp4"}},
        {"type": "audio_url", "audio_url": {"url": "http://127.0.0.1:9/a.wav"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "input_image", "image_url": "http://127.0.0.1:9/x.png"},
        {"type": "image_embeds", "image_embeds": "AAAA"},
        {"type": "file", "file": {"file_data": "AAAA"}},
        {"text": "no type"},
        {"type": "text", "text": "x", "uuid": "u", "image_url": "http://127.0.0.1:9/x.png"},
        {"type": "text", "text": "x", "video_url": {"url": "http://127.0.0.1:9/v.mp4"}},
    ],
)
def test_parts_other_than_text_and_images_are_refused(part):
    with pytest.raises(InvalidArgument) as e:
        take_images(chat({"type": "text", "text": "hi"}, part), True, 8)
    assert e.value.field == "messages[1].content[1]"
    assert "only text and image_url parts" in e.value.message


def test_the_count_and_the_model_are_checked_before_any_image_is_read():
    garbage = image_part("data:image/png;base64,not*base64")
    with pytest.raises(InvalidArgument) as e:
        take_images(chat(garbage, garbage, garbage), True, 2)
    assert e.value.field == "messages[1].content[2].image_url"
    assert "at most 2 images" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        take_images(chat({"type": "text", "text": "hi"}, garbage), False, 0)
    assert e.value.field == "messages[1].content[1]" and "text-only" in e.value.message
