"""A request's images, as every front hands them to the pipeline (gRPC's
`Image` bytes; the HTTP front's data: URLs, taken out by http/images.py):
checked from their headers before any pixel is decoded, then decoded.

What one request can make the server hold is bounded here for both fronts:
PNG, JPEG or WebP only (PIL tries no other decoder on a caller's bytes), one
frame (an animated PNG or WebP is refused: the model would see its first
frame alone), and one pixel budget for all of a request's images, read from
each header (PIL reads no pixel before `load`), so a decompression bomb is
refused from its header. Runs where the pipeline converts a request: off the event loop.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import InvalidArgument

# The formats a request's images may be in (the contract's Image).
FORMATS = ("PNG", "JPEG", "WEBP")
NOT_AN_IMAGE = "is not a PNG, JPEG or WebP image"
# All of a request's images, decoded (3 bytes a pixel: 96 MiB); one image
# may take it all (8192 x 4096). PIL's own bomb check stops at 179M.
MAX_PIXELS = 1 << 25


def checked_pixels(data: bytes, field: str, room: int) -> int:
    """The pixels of the image in `data`, read from its header (and a PNG's
    chunks checked whole, without decompressing them); INVALID_ARGUMENT
    naming `field` for bytes that are not a PNG, JPEG or WebP image, for an
    animated one, or for more than `room` pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            width, height = img.size
            frames = getattr(img, "n_frames", 1)
            if frames > 1:
                raise InvalidArgument(
                    field, f"is animated ({frames} frames): send one frame as a picture"
                )
            if width * height > room:
                raise InvalidArgument(
                    field,
                    f"is {width}x{height} pixels: a request's images may hold "
                    f"{MAX_PIXELS:,} pixels in all ({room:,} left for this one)",
                )
            img.verify()  # a PNG's chunks and their checksums, to its end
    except InvalidArgument:
        raise
    except Image.DecompressionBombError as e:
        raise InvalidArgument(field, f"is over the pixels an image may hold ({e})") from None
    except Exception as e:  # PIL's errors on a caller's bytes are of many types
        why = "" if isinstance(e, UnidentifiedImageError) else f" ({e})"
        raise InvalidArgument(field, f"{NOT_AN_IMAGE}{why}") from None
    return width * height


def decoded_images(images: Sequence[pb.Image]) -> list[Any]:
    """The images as RGB PIL images, every header checked against the
    request's pixel budget before the first is decoded; INVALID_ARGUMENT
    naming `images[i].data` for one that is not a PNG, JPEG or WebP image
    (or is animated), is past
    the budget, or fails to decode."""
    from PIL import Image

    room = MAX_PIXELS
    for i, image in enumerate(images):
        room -= checked_pixels(image.data, f"images[{i}].data", room)
    decoded = []
    for i, image in enumerate(images):
        try:
            img = Image.open(io.BytesIO(image.data), formats=FORMATS)
            decoded.append(img.convert("RGB"))
        except Exception as e:  # corrupt past a valid header
            raise InvalidArgument(f"images[{i}].data", f"{NOT_AN_IMAGE} ({e})") from e
    return decoded
