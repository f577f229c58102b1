"""The ImageNet folder layout: which files a data set holds, checked, without torch.

Layout: DATA/train/<class>/**/<image> and, optionally, DATA/val/<class>/**/<image>, with at least 2
classes. Class folders may nest sub-folders and symlinks (followed; a broken one or a loop is an error
naming the link); names may hold spaces and any unicode but control characters. Images may be RGB,
grayscale (8 or 16 bit), CMYK, RGBA or palette images: all are read as RGB. Files whose names start
with "." are ignored. An image that cannot be decoded (corrupt, or more pixels than PIL's guard against
decompression bombs allows) is never skipped silently: `find_bad_images` lists every such file with its
reason, and the trainer either refuses them all in one line (naming a list file) or, asked to, trains
without them and says so.

A data version that has been checked carries DATA/.verified.json (`write_verified`, `read_verified`):
{"format": 1, "version": V, "files": N, "check": "decode", "bad": [[path relative to DATA, reason], ...]}.
The trainer trusts it instead of decoding the images again.

The staging step lists a folder with `folder_images`, by the same rules, one class folder at a time.
"""

import errno
import json
import os
import re
import stat
import unicodedata
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import UsageError

SYNTHETIC = "synthetic"  # --data synthetic: batches generated on the device, no files (every framework's trainer)

# PIL and numpy are imported inside the functions that decode: listing a data set (what the staging
# step asks of this program on every run) needs neither, and skipping them halves its start-up.

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".pbm", ".gif", ".tif", ".tiff", ".webp"})
VERIFIED = ".verified.json"  # in a data folder's root: the check of its data version (hidden from the index)
SHOWN = 20  # bad files printed one per line; the list file holds them all
CHUNK = 4096  # images handed to the thread pool at a time (a future per image of a million would cost gigabytes)


class BadImage(UsageError):
    """An image that cannot be decoded: the message names the file and the fix; `reason` says why, without
    the path (what a list of bad files shows beside it)."""

    def __init__(self, message: str, path: str = "", reason: str = ""):
        super().__init__(message)  # one positional argument: a DataLoader worker re-raises it as cls(text)
        self.path, self.reason = path, reason or message


@dataclass(frozen=True)
class Split:
    """The images of one split: (path, class index) pairs and the class names, sorted."""

    classes: list[str]
    samples: list[tuple[str, int]]


def index_folder(data_dir: Path) -> tuple[Split, Split | None]:
    """Index DATA/train and DATA/val, checking the layout; val is None when absent."""
    train_dir, val_dir = split_folders(data_dir)
    train = index_split(train_dir, None)
    check_classes(data_dir, train.classes)
    return train, index_split(val_dir, train.classes) if val_dir else None


def folder_images(data_dir: Path) -> Iterator[str]:
    """Every image path of the folder, train's then val's, in index_folder's order and by its rules, one class
    folder at a time: what staging walks without holding a list of ImageNet's 1.33 million files."""
    train_dir, val_dir = split_folders(data_dir)
    classes = class_names(train_dir, None)
    check_classes(data_dir, classes)
    if val_dir:
        class_names(val_dir, classes)  # every val/ class is one of train/'s, checked before any file is listed
    for split_dir in filter(None, (train_dir, val_dir)):
        for path, _ in split_images(split_dir, classes):
            yield path


def split_folders(data_dir: Path) -> tuple[Path, Path | None]:
    """DATA/train, and DATA/val or None when absent, each checked to hold class folders."""
    kind = entry_kind(data_dir)
    if kind != "folder":
        what = "is a file, not a folder" if kind == "file" else "does not exist"
        raise UsageError(f"data folder {data_dir} {what}; point --data at a folder holding train/<class>/ images")
    train_dir, val_dir = data_dir / "train", data_dir / "val"
    if entry_kind(train_dir) != "folder" or not _class_dirs(train_dir):
        raise UsageError(
            f"data folder {data_dir} is empty or has no train/<class>/ folders; "
            "lay it out as train/<class>/<image> (and val/<class>/<image>)"
        )
    val_kind = entry_kind(val_dir)
    if val_kind == "missing":
        return train_dir, None
    if val_kind == "file" or not _class_dirs(val_dir):
        raise UsageError(f"{val_dir} has no class folders; add val/<class>/ images or remove val/")
    return train_dir, val_dir


def check_classes(data_dir: Path, classes: list[str]) -> None:
    """A classifier of one class learns nothing (its loss is 0 from the first step): refuse it."""
    if len(classes) == 1:
        raise UsageError(
            f"data folder {data_dir} has 1 class ({classes[0]}) under train/; a classifier needs at "
            "least 2: add another train/<class>/ folder of images"
        )


def index_split(split_dir: Path, classes: list[str] | None) -> Split:
    """List one split's images; `classes` (from train) fixes the label of each class folder."""
    classes = class_names(split_dir, classes)
    return Split(classes=classes, samples=list(split_images(split_dir, classes)))


def class_names(split_dir: Path, classes: list[str] | None) -> list[str]:
    """The split's class names: its own folders (train), or `classes` once every folder is one of them (val)."""
    found = [d.name for d in _class_dirs(split_dir)]
    unknown = sorted(set(found) - set(classes)) if classes is not None else []
    if unknown:
        raise unknown_classes(split_dir, unknown, classes or [])
    return classes if classes is not None else found


def unknown_classes(split_dir: Path, unknown: list[str], classes: list[str]) -> UsageError:
    """The error for class folders of a split that train/ lacks: the first few by name, each one that differs from
    a train/ class only in case with that class, how many more there are, and the fix."""
    by_case = {name.casefold(): name for name in classes}
    named = [
        f"{name} (train/ has {by_case[name.casefold()]}: class names are case-sensitive)"
        if name.casefold() in by_case
        else name
        for name in unknown[:5]
    ]
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    folders, them = ("class folders", "them") if len(unknown) > 1 else ("a class folder", "it")
    return UsageError(
        f"{split_dir} has {folders} that train/ lacks: {', '.join(named)}{more}; rename {them} "
        f"to train/'s class names, add {them} to train/, or remove {them}"
    )


def split_images(split_dir: Path, classes: list[str]) -> Iterator[tuple[str, int]]:
    """(path, label) of each image of the split, one class folder at a time."""
    labels = {name: label for label, name in enumerate(classes)}
    for folder in _class_dirs(split_dir):
        files = _image_files(folder)
        if not files:
            raise UsageError(f"class folder {folder} has no images; add images or remove the folder")
        yield from ((str(f), labels[folder.name]) for f in files)


def entry_kind(path: Path) -> str:
    """ "folder", "file" or "missing"; a symlink that loops or leads nowhere is an error that names it."""
    try:
        return "folder" if stat.S_ISDIR(os.stat(path).st_mode) else "file"
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise UsageError(
                f"{path} is a broken symlink (its target {_target(path)} does not exist); "
                "restore the target or remove the link"
            ) from None
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{path} is a symlink loop (it points to {_target(path)}, which leads back to itself); "
                "remove the link or point it at a real folder or image"
            ) from None
        raise UsageError(f"cannot read {path} ({exc.strerror}); fix its permissions or remove it") from None


def _target(link: Path) -> str:
    """Where a symlink points, as written in the link."""
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def check_name(name: str, folder: Path | str = "") -> None:
    """The one rule for the names of a data set's files and folders (the orchestrator imports it): valid UTF-8,
    no control character. The staging lists names one per line, and every message shows a name on one line."""
    if name.isprintable():  # the common case, in C: no control character, no undecodable byte
        return
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{os.fsencode(os.path.join(folder, name))!r} is not a valid UTF-8 name; rename it") from None
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)  # what splitlines splits
    if bad is not None:
        raise UsageError(
            f"{os.path.join(folder, name)!r} has a control character ({bad!r}) in its name; rename it to printable text"
        )


def _visible(folder: Path) -> list[tuple[Path, str]]:
    """The entries of a folder that do not start with ".", sorted, each with its kind; names and links checked
    (a link costs a stat, other entries none)."""
    try:
        with os.scandir(folder) as found:
            entries = sorted((e for e in found if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"cannot list {folder} ({exc.strerror}); fix its permissions or remove it") from None
    visible = []
    for entry in entries:
        check_name(entry.name, folder)
        path = folder / entry.name
        if entry.is_symlink():
            visible.append((path, entry_kind(path)))
        else:
            visible.append((path, "folder" if entry.is_dir(follow_symlinks=False) else "file"))
    return visible


def _class_dirs(split_dir: Path) -> list[Path]:
    return [path for path, kind in _visible(split_dir) if kind == "folder"]


def _image_files(folder: Path, above: frozenset = frozenset()) -> list[Path]:
    """Every image under a class folder, recursively (links followed); anything else not hidden is an error.
    `above` holds the real paths of the folders walked down to here: a link to one of them, or to a folder
    holding one, would never end."""
    above = above | {os.path.realpath(folder)}
    files, subfolders = [], []
    for path, kind in _visible(folder):
        if kind == "folder" and _holds_any(path, above):
            raise UsageError(
                f"{path} is a symlink loop (it points to {_target(path)}, a folder that holds it); remove the link"
            )
        if kind == "folder":
            subfolders.append(path)
        elif path.suffix.lower() not in IMAGE_SUFFIXES:
            raise UsageError(f"{path} is not an image file; remove it or move it out of the data folder")
        elif not os.access(path, os.R_OK):
            raise UsageError(f"cannot read {path} (permission denied); fix its permissions or remove it")
        else:
            files.append(path)
    return files + [f for sub in subfolders for f in _image_files(sub, above)]


def _holds_any(folder: Path, others: frozenset) -> bool:
    """Whether the real folder behind `folder` is, or holds, one of the real paths `others`."""
    real = os.path.join(os.path.realpath(folder), "")
    return any(os.path.join(other, "").startswith(real) for other in others)


@contextmanager
def opened(path: str, action: str = "decode"):
    """The PIL image at `path`; any failure to open or decode it (in the `with` body too) is a UsageError that
    names the file and why. Decoders fail in many ways (OSError, SyntaxError, struct.error, EOFError, ...)."""
    from PIL import Image

    warnings.simplefilter("error", Image.DecompressionBombWarning)  # refused by name, not decoded for minutes
    try:
        with Image.open(path) as img:
            yield img
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        why = (
            f"{int(pixels.group(1)) if pixels else 'too many'} pixels, more than the {Image.MAX_IMAGE_PIXELS} "
            "that decoding allows (a guard against decompression bombs)"
        )
        raise BadImage(f"image {path} has {why}; shrink it or remove the file", path, why) from None
    except Exception as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BadImage(
            f"cannot {action} image {path} ({why}); replace or remove the file", path, why.replace(f" '{path}'", "")
        ) from None  # PIL names the file: the list already does


def load_rgb(path: str):
    """Decode an image as RGB (a PIL image), whatever its mode; a corrupt file is a UsageError naming it."""
    with opened(path) as img:
        if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
        elif img.mode.startswith("I") or img.mode == "F":
            img = _to_8_bit(img)
        return img.convert("RGB")


def _to_8_bit(img):
    """16-bit and float grayscale to 8 bits (PIL's own conversion clips everything above 255)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(img, dtype=np.float32)
    peak = 65535.0 if img.mode.startswith("I;16") or pixels.max() > 255 else 255.0
    return Image.fromarray(np.clip(pixels * (255.0 / peak), 0, 255).astype(np.uint8), mode="L")


def check_image(path: str) -> None:
    """Decode an image fully enough to find truncation or corruption (JPEGs at reduced scale: fast)."""
    with opened(path) as img:
        img.draft("RGB", (64, 64))  # JPEG only: DCT scaling still reads every byte of the scan
        img.load()


def check_header(path: str) -> None:
    """Check that a file is an image of a known format, reading its header only (fast)."""
    with opened(path, "read") as img:
        img.verify()


def verify_images(samples: list[tuple[str, int]], rank: int = 0, world_size: int = 1, decode: bool = True) -> int:
    """Decode (or with decode=False, header-check) this worker's share of the images, on all cores."""
    mine = [path for path, _ in samples[rank::world_size]]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(check_image if decode else check_header, mine))  # PIL decodes without the GIL
    return len(mine)


def image_problem(path: str, decode: bool = True) -> str | None:
    """Why the image at `path` cannot be decoded (decode=False: read as an image by its header), or None."""
    try:
        (check_image if decode else check_header)(path)
    except BadImage as exc:
        return exc.reason
    return None


def find_bad_images(paths: list[str], decode: bool = True) -> list[tuple[str, str]]:
    """Every image of `paths` that cannot be decoded, as (path, reason) in the order given, checked on all
    cores (PIL decodes without the GIL; JPEGs at reduced scale, as check_image does)."""
    bad = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for start in range(0, len(paths), CHUNK):
            chunk = paths[start : start + CHUNK]
            reasons = pool.map(lambda path: image_problem(path, decode), chunk)
            bad += [(path, why) for path, why in zip(chunk, reasons) if why is not None]
    return bad


def _one_line(text: str) -> str:
    """`text` with its tabs and line breaks as spaces: a reason must stay one field of one line."""
    return " ".join(text.split()) if not text.isprintable() else text


def write_bad_list(bad: list[tuple[str, str]], dest: Path) -> Path:
    """Write `bad` to `dest` as TSV, one `path<TAB>reason` per line (names hold no tab: check_name); `dest`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(f"{path}\t{_one_line(why)}\n" for path, why in bad), encoding="utf-8")
    return dest


def read_bad_list(path: Path) -> list[tuple[str, str]]:
    """The (path, reason) pairs of a list that write_bad_list wrote."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t", 1)) for line in lines if line]


def bad_image_lines(bad: list[tuple[str, str]], shown: int = SHOWN) -> list[str]:
    """The first `shown` bad images, one line each, and how many more the list holds."""
    lines = [f"cannot decode {path}: {_one_line(why)}" for path, why in bad[:shown]]
    return lines + ([f"... and {len(bad) - shown} more"] if len(bad) > shown else [])


def bad_images_error(
    bad: list[tuple[str, str]],
    checked: int,
    listing: Path | None = None,
    folder: Path | str = "",
    verb: str = "decoded",
) -> UsageError:
    """The one-line error for a non-empty list of bad images: how many of how many checked (in `folder`), the
    first, the list file (None: the one file is named here and listed nowhere else) and the two fixes."""
    n, (path, why) = len(bad), bad[0]
    where = f" in {folder}" if str(folder) else ""
    head = f"{n} of {checked} images{where} cannot be {verb} ({'' if n == 1 else 'first: '}{path}: {_one_line(why)})"
    listed = "" if listing is None else f"; {'it is' if n == 1 else f'all {n} are'} listed in {listing}"
    them = "it" if n == 1 else "them"
    return UsageError(
        f"{head}{listed}; replace or remove {them}, or pass --bad-files skip (training.bad_files: "
        f"skip) to train without {them}"
    )


@dataclass(frozen=True)
class Verified:
    """The check of a data version: which version, how many images were checked, how, and the bad ones (paths
    relative to the data folder, with the reason)."""

    version: str
    files: int
    check: str
    bad: list[tuple[str, str]]


def write_verified(data_dir: Path, version: str, files: int, bad: list[tuple[str, str]], check: str = "decode") -> Path:
    """Write DATA/.verified.json (atomically: a reader never sees half of it); its path. `bad` holds paths
    relative to DATA; `files` counts every image checked, the bad ones included."""
    return write_record(Path(data_dir) / VERIFIED, Verified(version, files, check, bad))


def write_record(path: Path, record: Verified) -> Path:
    """A verification record as JSON at `path`, written to a temporary name and renamed."""
    body = {
        "format": 1,
        "version": record.version,
        "files": record.files,
        "check": record.check,
        "bad": [[p, _one_line(why)] for p, why in record.bad],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(body, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(partial, path)
    return path


def read_verified(data_dir: Path) -> Verified | None:
    """DATA/.verified.json, or None when the folder has none; one that is not valid is a UsageError naming it."""
    return read_record(Path(data_dir) / VERIFIED)


def read_record(path: Path) -> Verified | None:
    """The verification record at `path` (None when there is none), checked field by field."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _invalid(path, f"not readable JSON: {_one_line(str(exc))}") from None
    if why := record_problem(body):
        raise _invalid(path, why)
    return Verified(body["version"], body["files"], body["check"], [(p, why) for p, why in body["bad"]])


def record_problem(body: object) -> str | None:
    """What makes `body` no verification record of format 1, or None."""
    if not isinstance(body, dict) or body.get("format") != 1:
        return 'it needs "format": 1'
    if not isinstance(body.get("version"), str) or not body["version"]:
        return '"version" must name the data version'
    if not isinstance(body.get("files"), int) or isinstance(body["files"], bool) or body["files"] < 0:
        return '"files" must be the number of images checked'
    if body.get("check") != "decode":
        return '"check" must be "decode" (every image decoded)'
    bad = body.get("bad")
    if not isinstance(bad, list) or not all(_is_bad_entry(entry) for entry in bad):
        return '"bad" must be a list of [path relative to the data folder, reason]'
    return None


def _is_bad_entry(entry: object) -> bool:
    """[relative path inside the folder, reason]."""
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) and x for x in entry)):
        return False
    return not os.path.isabs(entry[0]) and ".." not in Path(entry[0]).parts


def _invalid(path: Path, why: str) -> UsageError:
    """The error for a record that cannot be trusted, naming it and the two ways out."""
    return UsageError(
        f"{path} is not a valid verification record ({why}); delete it to decode the images again, "
        "or sync the data version again"
    )


def without(split: Split | None, bad: set[str]) -> Split | None:
    """`split` without the samples whose paths are in `bad`; the classes (and so the labels) unchanged."""
    if split is None:
        return None
    return Split(classes=split.classes, samples=[s for s in split.samples if s[0] not in bad])


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists: where a folder to be made at `path` would be made."""
    return next((p for p in [path, *path.parents] if os.path.lexists(p)), Path("."))


def cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in `folder` (None when one can): a file is made there and removed."""
    probe = folder / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return exc.strerror
    return None
