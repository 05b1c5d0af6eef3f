"""ImageDecoder through Pillow (an optional dependency: without it the node falls back,
and explain says why)."""
from __future__ import annotations

import io

import numpy as np

from ..registry import kernel


def _pillow_missing(ctx):
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return "Pillow is not installed (pip install pillow)"
    return None


@kernel("ImageDecoder", dtypes=[np.uint8], accepts=_pillow_missing)
def image_decoder(encoded, *, pixel_format="RGB"):
    import PIL.Image

    try:
        img = PIL.Image.open(io.BytesIO(encoded.tobytes()))
        img.load()
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as e:
        raise ValueError(f"cannot decode the image: {e}") from e
    if pixel_format == "Grayscale":
        return np.asarray(img.convert("L"), dtype=np.uint8)[:, :, None].copy()
    rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    if pixel_format == "BGR":
        return rgb[:, :, ::-1].copy()
    if pixel_format != "RGB":
        raise ValueError(f"pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}")
    return rgb.copy()
