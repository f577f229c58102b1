"""Images that cannot be decoded, found once per run before training, without torch: every framework's trainer
(train.py for PyTorch, tf/ for TensorFlow and Keras) applies the same rules through these functions.

Where the knowledge comes from (`known_bad_images`): DATA/.verified.json when the data version carries one
(nothing decoded), else a decode (--verify-images: the preflight all of the images, or each worker its share, the
lists combined), else the preflight's list in OUT. --bad-files fail refuses them in one line; skip trains without
them and says so (`usable_splits`); metrics.json records what was left out (`data_facts`).
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path

from nodelib.image_files import SHOWN, bad_image_lines, bad_images_error, find_bad_images, write_bad_list
from nodelib.layout import Split, without
from nodelib.verified import VERIFIED, Verified, read_record, read_verified, write_record

BAD_LIST = "bad-files.tsv"  # in OUT: every image that cannot be decoded, `path<TAB>reason`, paths relative to DATA
CHECKED = "images-checked.json"  # in OUT: the preflight's decode of DATA, which the workers read instead of decoding
DECODED = "decoded in this run"

Gather = Callable[[list | None], list]  # every rank's value, in rank order (a collective: every rank calls it)

log = logging.getLogger("trainer")


def one_rank(mine: list | None) -> list:
    """The gather of a run of one process: its own value."""
    return [mine]


def known_bad_images(
    data_dir: Path,
    out: Path,
    paths: list[str],
    decode: bool,
    rank: int = 0,
    world_size: int = 1,
    gather: Gather = one_rank,
) -> tuple[Verified | None, str]:
    """The images of DATA (`paths`) that cannot be decoded, checked at most once per run, and where that
    knowledge comes from: DATA/.verified.json, else this worker's share of a decode (decode=True; `gather`
    gives every worker's share, so all agree), else the preflight's decode in OUT; (None, why) when nothing
    checked the images."""
    verified = read_verified(data_dir)
    if verified is not None:
        source = f"{data_dir / VERIFIED} (data version {verified.version}: checked, not decoded again)"
        return still_here(verified, data_dir, paths), source
    if decode:
        mine = [[os.path.relpath(path, data_dir), why] for path, why in find_bad_images(paths[rank::world_size])]
        bad = sorted(tuple(pair) for share in gather(mine) for pair in share)
        return Verified(folder_identity(data_dir), len(paths), "decode", bad), DECODED
    handed = read_record(Path(out) / CHECKED)
    if handed is not None and (handed.version, handed.files) == (folder_identity(data_dir), len(paths)):
        return handed, f"the preflight's decode ({Path(out) / CHECKED})"
    return None, "no image was decoded (--no-verify-images and no .verified.json)"


def still_here(record: Verified, data_dir: Path, paths: list[str]) -> Verified:
    """`record` with only the bad images the folder still holds (one removed since the check is no longer bad)."""
    present = set(paths)
    bad = [(path, why) for path, why in record.bad if str(Path(data_dir) / path) in present]
    return Verified(record.version, record.files, record.check, bad)


def folder_identity(data_dir: Path) -> str:
    """What names a local data folder in a record the preflight hands to the workers: its real path."""
    return os.path.realpath(data_dir)


def hand_to_workers(out: Path, record: Verified | None) -> None:
    """The preflight's decode for the workers: OUT/images-checked.json when it found bad images, else none
    (an older one removed: the workers must not skip what this check found fine)."""
    if record is not None and record.bad:
        write_record(Path(out) / CHECKED, record)
    else:
        (Path(out) / CHECKED).unlink(missing_ok=True)


def bad_list_path(out: Path, count: int, policy: str) -> Path | None:
    """Where the bad images are listed: OUT/bad-files.tsv; None when the run is refused for one file, which the
    error names (a refused run then leaves no results folder behind)."""
    return None if policy == "fail" and count == 1 else Path(out) / BAD_LIST


def skip_bad_images(splits: tuple[Split, Split | None], data_dir: Path, bad: list[tuple[str, str]]):
    """The (train, val) splits without the `bad` images (paths relative to DATA); labels unchanged."""
    paths = {str(Path(data_dir) / path) for path, _ in bad}
    return without(splits[0], paths), without(splits[1], paths)


def bad_files_entry(bad: list[tuple[str, str]], listing: Path | None) -> dict:
    """metrics.json's record of the images a run left out: how many, the list file, the first of them."""
    return {"count": len(bad), "list": str(listing), "first": [list(pair) for pair in bad[:SHOWN]]}


def usable_splits(
    args, out: Path, splits: tuple[Split, Split | None], rank: int = 0, world: int = 1, gather: Gather = one_rank
):
    """(train, val, record, source): the splits of --data (`splits`, as indexed) this run uses, all of them or
    without the images that cannot be decoded (--bad-files skip), with the record that lists those and where it came
    from; --bad-files fail refuses them in one line (the list in `out`). Every rank calls it (a decode is shared out;
    `gather` is the collective) and gets the same answer. train.py's own usable_splits does the same with its
    backend's collectives."""
    paths = [path for split in splits if split for path, _ in split.samples]
    data_dir, out = Path(args.data), Path(out)
    record, source = known_bad_images(data_dir, out, paths, args.verify_images, rank, world, gather)
    if record is not None and record.files != len(paths):
        log.warning(
            "%s counts %d images, the data folder holds %d: it may be out of date", source, record.files, len(paths)
        )
    if record is None or not record.bad:
        log.info("images: %s", f"{record.files} checked, none bad ({source})" if record else source)
        return *splits, record, source
    listing = bad_list_path(out, len(record.bad), args.bad_files)
    if rank == 0:
        show_bad_images(record, listing, source)
    gather(None)  # rank 0 has written the list before any rank names it
    if args.bad_files == "fail":
        raise bad_images_error(record.bad, record.files, listing, args.data)
    log.info(
        "images: leaving out the %d of %d that cannot be decoded (--bad-files skip; listed in %s; known from %s)",
        len(record.bad),
        record.files,
        listing,
        source,
    )
    return *skip_bad_images(splits, data_dir, record.bad), record, source


def show_bad_images(record: Verified, listing: Path | None, source: str) -> None:
    """Rank 0: the list of bad images written to `listing`, and its first lines in the log."""
    if listing is not None:
        write_bad_list(record.bad, listing)
    log.warning("%d of %d images cannot be decoded (%s):", len(record.bad), record.files, source)
    for line in bad_image_lines(record.bad):
        log.warning("  %s", line)


def data_facts(args, out: Path, train: Split, val: Split | None, record: Verified | None) -> dict:
    """What metrics.json records about the data: images trained and validated on, and those left out."""
    facts: dict[str, object] = {"train_images": len(train.samples), "val_images": len(val.samples) if val else 0}
    if record is not None and record.bad:
        listing = bad_list_path(Path(out), len(record.bad), args.bad_files)
        facts["bad_files"] = bad_files_entry(record.bad, listing)
    log.info("data: training on %d images, validating on %d", facts["train_images"], facts["val_images"])
    return facts
