"""Images as they travel between roles: PIL images in a process, PNG bytes on disk.

Environments draw PIL images; engines and the trainer's image processor take PIL images; the
rollout store keeps PNG bytes (lossless, small for drawn scenes and screenshots). Every consumer
goes through :func:`to_pil`, so a sample read back from the store trains like a fresh one.
"""

from __future__ import annotations

import io
from typing import Any


def to_pil(image: Any):  # -> PIL.Image.Image
    """An RGB PIL image from a PIL image or encoded bytes (PNG/JPEG)."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        image = Image.open(io.BytesIO(bytes(image)))
        image.load()
    if not isinstance(image, Image.Image):
        raise TypeError(f"an image must be a PIL image or encoded bytes, got {type(image).__name__}")
    return image if image.mode == "RGB" else image.convert("RGB")


def to_png(image: Any) -> bytes:
    """PNG bytes of a PIL image (bytes pass through unchanged)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    buffer = io.BytesIO()
    to_pil(image).save(buffer, format="PNG")
    return buffer.getvalue()
