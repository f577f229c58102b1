"""Small image files written on the spot: random pixels in any PIL mode, and PNG headers that only claim a size."""

import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, mode: str = "RGB", size: int = 12, fmt: str | None = None) -> Path:
    """A small random image in the given PIL mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode if mode != "P" else "L"]
    pixels = rng.integers(0, 255, (size, size, channels), dtype=np.uint8).squeeze()
    image = Image.fromarray(pixels, mode="L" if mode == "P" else mode)
    if mode == "P":
        image = image.convert("P")
        image.info["transparency"] = 0
    image.save(path, format=fmt)
    return path


def write_png_header(path, width: int, height: int):
    """A PNG that declares width x height pixels and holds none: PIL's decompression-bomb check reads only this."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IEND", b"")
    )
    return path
