"""Partial JPEG decoding for the fast loader (jpeg_crop.c): only the random-resized crop is decoded; JPEGs with a
restart marker after every MCU (`add_restarts` rewrites them so, losslessly) have only the crop's MCUs decoded.

It also makes the fast loader's uint8 batches normalised floats on a CPU device in one pass (`normalise`).

The C file is compiled once per version of it (`cc -O3 -ffp-contract=off -shared -fPIC ... -ljpeg`, a second or
less; the C file names these flags, so a change of them is a new version) into
TRAINFLOW_JPEG_CROP_DIR (default ~/.cache/trainflow, else the temporary folder) and loaded with ctypes; the training
images compile it when they are built (`python jpeg_crop.py DIR`) and name DIR. Without a C compiler or libjpeg's
headers (Debian and Ubuntu: `apt-get install gcc libjpeg-dev`), `library()` is None and `unavailable()` says why:
the fast loader then decodes whole images, as before, and each worker says so once.
"""

import ctypes
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("jpeg_crop.c")
DIR = "TRAINFLOW_JPEG_CROP_DIR"  # where the library is kept (or was built ahead, in the training images)
FLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC")  # -O3 vectorises normalise's loop; no fused multiply-add
TO_RGB = (1, 3)  # the components of the JPEGs decoded here (gray, colour); CMYK and YCCK (4) are PIL's to convert


class JpegError(RuntimeError):
    """libjpeg refused the data (corrupt, truncated, an unsupported kind)."""


def cache_dir() -> Path:
    """TRAINFLOW_JPEG_CROP_DIR, else ~/.cache/trainflow, else (a home that cannot be written) the temporary folder."""
    if os.environ.get(DIR):
        return Path(os.environ[DIR])
    home = Path.home() / ".cache" / "trainflow"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Path(tempfile.gettempdir())
    return home


def build(dest_dir: Path) -> Path:
    """The library for this version of jpeg_crop.c in `dest_dir` (compiled there unless it already is); written
    whole (a temporary name, then renamed), so ranks compiling at once never load half a file."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = dest_dir / f"jpeg_crop-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise OSError("no C compiler (cc) on PATH")
    dest_dir.mkdir(parents=True, exist_ok=True)
    partial = dest_dir / f".{target.name}.{os.getpid()}"
    done = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE), "-ljpeg"], capture_output=True, text=True)
    if done.returncode:
        partial.unlink(missing_ok=True)
        said = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise OSError(f"{compiler} could not build {SOURCE.name}: {said[-1]}")
    os.replace(partial, target)
    return target


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    try:
        lib = ctypes.CDLL(str(build(cache_dir())))
    except OSError as exc:
        return None, str(exc)
    lib.jpeg_crop_decode.argtypes = [
        ctypes.c_char_p,
        ctypes.c_ulong,
        *[ctypes.c_int] * 4,
        ctypes.c_void_p,
        ctypes.c_char_p,
    ]
    lib.jpeg_crop_info.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    lib.jpeg_crop_add_restarts.argtypes = [
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_ulong),
        ctypes.c_char_p,
    ]
    lib.jpeg_crop_cuttable.argtypes = [ctypes.c_char_p, ctypes.c_ulong]
    lib.jpeg_crop_free.argtypes = [ctypes.c_void_p]
    lib.jpeg_crop_normalise.argtypes = [
        *[ctypes.c_void_p] * 2,
        *[ctypes.c_size_t] * 2,
        *[ctypes.c_void_p] * 2,
        ctypes.c_int,
    ]
    return lib, ""


def library() -> ctypes.CDLL | None:
    return _load()[0]


def loaded() -> ctypes.CDLL:
    """The library, for the functions below (their callers check library() first); OSError saying why it is not."""
    lib = library()
    if lib is None:
        raise OSError(f"partial JPEG decoding is unavailable: {unavailable()}")
    return lib


def unavailable() -> str:
    """Why partial decoding is off ('' when it is on)."""
    return _load()[1]


def decode_crop(data: bytes, top: int, left: int, height: int, width: int) -> torch.Tensor:
    """Rows [top, top+height) and columns [left, left+width) of the JPEG `data` as an RGB uint8 CHW tensor (a
    view of HWC memory, the layout torchvision's uint8 resize is fastest on); JpegError when libjpeg refuses it."""
    lib = loaded()
    out = torch.empty(height, width, 3, dtype=torch.uint8)
    message = ctypes.create_string_buffer(lib.jpeg_crop_message_size())
    status = lib.jpeg_crop_decode(data, len(data), top, left, height, width, out.data_ptr(), message)
    if status == -2:
        raise ValueError(f"crop {height}x{width} at ({top}, {left}) is not inside the image")
    if status:
        raise JpegError(message.value.decode(errors="replace"))
    return out.permute(2, 0, 1)


def info(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, components) from a JPEG's header, read without libjpeg (a few markers); None when `data`
    does not start with a JPEG header."""
    found = (ctypes.c_int * 3)()
    return tuple(found) if loaded().jpeg_crop_info(data, len(data), found) == 0 else None


def header_shape(content: bytes) -> tuple[int, int, int] | None:
    """(width, height, components) from a JPEG's header: `info` where the C library is there, else PIL's reader
    (the same numbers); None when `content` is not a JPEG either can read."""
    if library():
        return info(content)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(content)) as img:
            return (*img.size, len(img.getbands())) if img.format == "JPEG" else None
    except Exception:  # any failure to read the header: data.read_uint8 names the file and why
        return None


def cuttable(data: bytes) -> bool:
    """Whether decode_crop decodes only the crop's restart intervals of this JPEG (one sequential scan, a restart
    interval that divides a row of MCUs), not every row down to the crop's last."""
    return bool(loaded().jpeg_crop_cuttable(data, len(data)))


def add_restarts(data: bytes, interval: int = 1) -> bytes:
    """The JPEG `data` rewritten with a restart marker after every `interval` MCUs, its Huffman tables optimised:
    the same DCT coefficients, so the same pixels; JpegError when libjpeg refuses it."""
    lib, out, size = loaded(), ctypes.c_void_p(), ctypes.c_ulong()
    message = ctypes.create_string_buffer(lib.jpeg_crop_message_size())
    if lib.jpeg_crop_add_restarts(data, len(data), interval, ctypes.byref(out), ctypes.byref(size), message):
        raise JpegError(message.value.decode(errors="replace"))
    try:
        return ctypes.string_at(out, size.value)
    finally:
        lib.jpeg_crop_free(out)


def normalise(images: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, planar: bool) -> torch.Tensor:
    """The uint8 batch `images` (N, 3, H, W) in channels-last memory (N, H, W, 3 contiguous), as floats `images *
    scale + shift` per channel (float tensors of 3), in one pass: contiguous NCHW floats (`planar`) or channels-last."""
    fmt = torch.contiguous_format if planar else torch.channels_last
    out = torch.empty(images.shape, dtype=torch.float32, memory_format=fmt)
    n, _, h, w = images.shape
    loaded().jpeg_crop_normalise(
        images.data_ptr(), out.data_ptr(), n, h * w, scale.data_ptr(), shift.data_ptr(), planar
    )
    return out


if __name__ == "__main__":  # the training images build it ahead: python jpeg_crop.py DIR
    print(build(Path(sys.argv[1])))
