"""The ImageNet folder layout: which files a data set holds, checked, without torch.

Layout: DATA/train/<class>/**/<image> and, optionally, DATA/val/<class>/**/<image>, with at least 2
classes. Class folders may nest sub-folders and symlinks (followed; a broken one or a loop is an error
naming the link); names may hold spaces and any unicode but control characters. Files and folders whose names
start with "." are hidden and ignored, but a hidden folder of train/ or val/ that holds images is refused: it looks
like a class, and would be left out without a word. Decoding the images is image_files.py's; the record of a
checked version verified.py's.

The staging step lists a folder with `folder_images`, by the same rules, one class folder at a time.
"""

import errno
import os
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nodelib.errors import UsageError

SYNTHETIC = "synthetic"  # --data synthetic: batches generated on the device, no files (every framework's trainer)
# The layouts of a data set: the ImageNet layout above (trainflow's trainer reads it), or any files under the folder (a
# user's script reads them): staging lists, checks and stages each by its own rules.
IMAGENET_LAYOUT, FILES_LAYOUT = "imagenet", "files"
LAYOUTS = (IMAGENET_LAYOUT, FILES_LAYOUT)
# Photo formats that PIL cannot read, and how to make JPEGs of them. `mogrify` is ImageMagick 6's name, as Debian and
# Ubuntu ship it; ImageMagick 7 names it `magick mogrify`.
CONVERT = {
    suffix: f"a {name} image, which trainflow cannot read: convert it to JPEG first ({how})"
    for suffixes, name, how in (
        (
            (".heic", ".heif"),
            "HEIC",
            "`heif-convert IN.heic OUT.jpg`, or ImageMagick's `mogrify -format jpg *.heic`, "
            "`magick mogrify` in its version 7",
        ),
        ((".avif",), "AVIF", "ImageMagick's `mogrify -format jpg *.avif`, `magick mogrify` in its version 7"),
    )
    for suffix in suffixes
}
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".pbm", ".gif", ".tif", ".tiff", ".webp"})


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
        what = "is a file, not a folder" if kind in ("file", "special") else "does not exist"
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


def check_hidden_classes(split_dir: Path) -> None:
    """Refuse a hidden folder (its name starts with ".") of a split that holds images: named like a class, it is not
    one (.git or .ipynb_checkpoints hold no images, and pass)."""
    try:
        with os.scandir(split_dir) as entries:
            hidden = sorted(e.path for e in entries if e.name.startswith(".") and e.is_dir(follow_symlinks=False))
    except OSError:  # unreadable: _visible names it
        return
    for path in hidden:
        if images := _images_in(path):
            many = "s" if images > 1 else ""
            raise UsageError(
                f'{path} holds {images} image{many}, but its name starts with ".", which hides it: it is no '
                'class; rename it without the leading "." to train on them, or move it out of the data folder'
            )


def _images_in(folder: str) -> int:
    """How many files directly in `folder` are named as images."""
    try:
        with os.scandir(folder) as entries:
            return sum(os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES for e in entries)
    except OSError:
        return 0


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
    check_hidden_classes(split_dir)
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
    """ "folder", "file", "special" (a FIFO, socket or device: never opened) or "missing"; a symlink that loops or
    leads nowhere is an error that names it."""
    try:
        return kind_of(os.stat(path).st_mode)
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


def kind_of(mode: int) -> str:
    """entry_kind's word for a file mode."""
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special"


def special_name(path: Path) -> str:
    """What a special file is, for its error: reading one may wait forever (a FIFO with no writer)."""
    mode = os.stat(path).st_mode
    for test, name in ((stat.S_ISFIFO, "named pipe (FIFO)"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "device file"


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
            regular = "file" if entry.is_file(follow_symlinks=False) else "special"
            visible.append((path, "folder" if entry.is_dir(follow_symlinks=False) else regular))
    return visible


def _class_dirs(split_dir: Path) -> list[Path]:
    return [path for path, kind in _visible(split_dir) if kind == "folder"]


def folder_files(data_dir: Path) -> Iterator[str]:
    """Every file of a data set in the files layout (a user's script reads it: images/ and masks/, COCO JSON,
    TFRecords, CSV), by the rules above for names, hidden files, links and special files, one folder at a time."""
    kind = entry_kind(data_dir)
    if kind != "folder":
        what = "is a file, not a folder" if kind in ("file", "special") else "does not exist"
        raise UsageError(f"data folder {data_dir} {what}; point --data at the folder your script reads")
    found = _image_files(data_dir, images=False)
    if not found:
        raise UsageError(f"data folder {data_dir} holds no files (hidden ones are left out); add your data to it")
    yield from map(str, found)


def layout_files(data_dir: Path, layout: str) -> Iterator[str]:
    """The files of a data set in `layout` (LAYOUTS): the ImageNet layout's images, or every file."""
    return folder_files(data_dir) if layout == FILES_LAYOUT else folder_images(data_dir)


def _image_files(folder: Path, above: frozenset = frozenset(), images: bool = True) -> list[Path]:
    """Every image under a class folder, recursively (links followed); anything else not hidden is an error.
    `above` holds the real paths of the folders walked down to here: a link to one of them, or to a folder
    holding one, would never end. With `images` false, every file (the files layout)."""
    above = above | {os.path.realpath(folder)}
    files, subfolders = [], []
    for path, kind in _visible(folder):
        if kind == "folder" and _holds_any(path, above):
            raise UsageError(
                f"{path} is a symlink loop (it points to {_target(path)}, a folder that holds it); remove the link"
            )
        if kind == "folder":
            subfolders.append(path)
        elif kind == "special":  # never opened: a FIFO would block every command that reads it
            raise UsageError(
                f"{path} is a {special_name(path)}, not {'an image' if images else 'a data'} file; remove it or move "
                "it out of the data folder"
            )
        elif not images and os.access(path, os.R_OK):
            files.append(path)
        elif not images:
            raise UsageError(f"cannot read {path} (permission denied); fix its permissions or remove it")
        elif path.suffix.lower() in CONVERT:
            raise UsageError(f"{path} is {CONVERT[path.suffix.lower()]}; remove the originals from the data folder")
        elif path.suffix.lower() not in IMAGE_SUFFIXES:
            raise UsageError(f"{path} is not an image file; remove it or move it out of the data folder")
        elif not os.access(path, os.R_OK):
            raise UsageError(f"cannot read {path} (permission denied); fix its permissions or remove it")
        else:
            files.append(path)
    return files + [f for sub in subfolders for f in _image_files(sub, above, images)]


def _holds_any(folder: Path, others: frozenset) -> bool:
    """Whether the real folder behind `folder` is, or holds, one of the real paths `others`."""
    real = os.path.join(os.path.realpath(folder), "")
    return any(os.path.join(other, "").startswith(real) for other in others)


def without(split: Split | None, bad: set[str]) -> Split | None:
    """`split` without the samples whose paths are in `bad`; the classes (and so the labels) unchanged."""
    if split is None:
        return None
    return Split(classes=split.classes, samples=[s for s in split.samples if s[0] not in bad])
