"""Images in OpenAI chat messages (`image_url` content parts), checked and
taken out of their data: URLs before any work, and handed on as the bytes a
gRPC `Image` carries: the pipeline decodes them as it decodes gRPC's
(generation/convert.py), so the engine sees the same image either way.

The server fetches no URL: a request that could name one would make it
reach any host its network reaches (SSRF), or read its files (`file:`).
Only `data:` URLs in base64 are taken, and only text and image_url parts
(vLLM's renderer would fetch an audio or video URL too). What a caller can
make grow is bounded in the order it would cost: the count (the engine's
own limit per prompt, vLLM's --limit-mm-per-prompt, which gRPC meets in
the engine), each image's bytes before its base64 is decoded, then, read
from its header alone (PIL reads no pixel before `load`), its format and
its pixels, against one budget for all of a request's images. vLLM's
renderer then places each image's placeholder from an empty `image_pil`
part: it decodes nothing and fetches nothing. All of it runs on the
tokenizing thread (chat.prepare_chat), never on the event loop.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation.images import MAX_PIXELS, checked_pixels
from rollout_service.status.errors import InvalidArgument

# One image's bytes: what the 16 MiB body leaves room for, with the chat's
# text, and more than a 4096 x 4096 JPEG photograph takes.
MAX_IMAGE_BYTES = 8 << 20
# Base64 of MAX_IMAGE_BYTES, padded: longer holds more.
_MAX_BASE64 = 4 * -(-MAX_IMAGE_BYTES // 3)
_EXAMPLE = "data:image/png;base64,..."


def take_images(messages: Sequence[Any], supports_images: bool, most: int) -> list[pb.Image]:
    """The images of vLLM's parsed chat `messages`, in order, as gRPC Images;
    each image part is replaced by an empty placeholder part in place (a
    content that pydantic validates lazily is made a list). 400 naming the
    part for anything but text and data: URL images, and for an image past
    a limit (module docstring); `most`: the engine's limit per prompt."""
    found = _image_parts(messages)
    if not found:
        return []
    if not supports_images:
        raise InvalidArgument(found[0][0], "this model is text-only and takes no images")
    if len(found) > most:
        raise InvalidArgument(
            found[most][0] + ".image_url",
            f"at most {most} images a request (the engine's limit per prompt, "
            "--limit-mm-per-prompt)",
        )
    images, room = [], MAX_PIXELS
    for field, content, j in found:
        data = image_bytes(content[j], field + ".image_url")
        room -= checked_pixels(data, field + ".image_url", room)
        images.append(pb.Image(data=data))
        content[j] = {"type": "image_pil", "image_pil": None}
    return images


def _image_parts(messages: Sequence[Any]) -> list[tuple[str, list[Any], int]]:
    """Each image part as (its field, its content list, its index there);
    400 for a part neither text nor image_url."""
    from pydantic import ValidationError
    from vllm.renderers.chat_utils import MM_PARSER_MAP, TEXT_PART_TYPES

    media_keys = set(MM_PARSER_MAP) - set(TEXT_PART_TYPES)
    found = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if content is None or isinstance(content, str):
            continue
        try:
            content = m["content"] = list(content)
        except ValidationError as e:  # a lazily validated part that is not one
            raise InvalidArgument(f"messages[{i}].content", _first_error(e)) from None
        for j, part in enumerate(content):
            field = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict):
                continue  # a bare string: text
            kind = part.get("type")
            if kind == "image_url":
                found.append((field, content, j))
            elif (
                not isinstance(kind, str) or kind not in TEXT_PART_TYPES or media_keys & part.keys()
            ):
                # vLLM's renderer fetches an audio or video URL, and by its
                # media key a part whatever its type (one with a uuid).
                raise InvalidArgument(
                    field, "only text and image_url parts are served (docs/openai.md)"
                )
    return found


def _first_error(e: Any) -> str:
    first = e.errors(include_url=False, include_input=False)[0]
    return str(first["msg"])


def image_bytes(part: dict[str, Any], field: str) -> bytes:
    """An image_url part's bytes, from its data: URL in base64 (bounded
    before it is decoded); 400 naming `field` otherwise."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str):
        raise InvalidArgument(field, f"needs a url: a data: URL ({_EXAMPLE})")
    detail = spec.get("detail", "auto") if isinstance(spec, dict) else "auto"
    if detail not in (None, "auto"):
        # The model sees the image as its processor sizes it, whatever the
        # detail: a setting that would change the output is refused.
        raise InvalidArgument(field + ".detail", f'only "auto" is served, got {detail!r}')
    scheme, colon, rest = url.partition(":")
    if not colon or scheme.strip().lower() != "data":
        raise InvalidArgument(
            field,
            "the server fetches no URL (http, https, file, ...): send the image inline "
            f"as a data: URL in base64 ({_EXAMPLE})",
        )
    header, comma, payload = rest.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise InvalidArgument(field, f"is not a data: URL in base64 ({_EXAMPLE})")
    media = header.split(";")[0].strip().lower()
    if media and not media.startswith("image/"):
        raise InvalidArgument(field, f"holds {media[:64]!r}, not an image")
    if len(payload) > _MAX_BASE64:
        raise InvalidArgument(field, f"holds over {MAX_IMAGE_BYTES} bytes, the most an image may")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidArgument(field, f"is not valid base64 ({e})") from None
    if not data:
        raise InvalidArgument(field, "holds no bytes")
    return data
