"""Shards and manifests: what changes when one file changes, and what stays."""

import os

import pytest

from infra.core.errors import BadInput
from infra.data import manifest as mf
from nodelib.errors import UntrustedInput, UsageError
from nodelib.layout import check_name
from tests.fakes.image_files import write_image


def no_check(paths: list[str]) -> list:
    return []


def indexed(root, workdir, keep=True):
    """The upload's index of the folder (hashes cached under workdir)."""
    return mf.scanned(root, workdir / "index.sqlite", no_check, keep)


def folder(root, n: int, changed: int | None = None):
    for i in range(n):
        (root / f"train/c{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"train/c{i % 3}/img {i}.jpg").write_bytes(b"changed" if i == changed else b"x" * (100 + i))
    return root


def shards_of(root, workdir, count: int) -> tuple[str, dict[str, set[str]]]:
    """The version and each shard's paths."""
    with indexed(root, workdir) as (index, _):
        version = index.plan_shards(count)
        return version, {sid: {e.path for e in index.shard_files(sid)} for sid in index.shards.values()}


def test_one_changed_file_changes_exactly_one_shard(tmp_path):
    before = shards_of(folder(tmp_path / "a", 200), tmp_path / "wa", 8)[1]
    after = shards_of(folder(tmp_path / "b", 200, changed=17), tmp_path / "wb", 8)[1]
    assert len(before) == 8
    assert len(set(before) - set(after)) == 1 and len(set(after) - set(before)) == 1
    (new,) = set(after) - set(before)
    assert "train/c2/img 17.jpg" in after[new]


def test_shard_count_is_kept_while_sizes_stay_near_the_target():
    assert mf.shard_count(1000, 100, previous=None) == 10
    assert mf.shard_count(1300, 100, previous=10) == 10  # grew 30%: same buckets, nothing moves
    assert mf.shard_count(2500, 100, previous=10) == 25  # shards would be 2.5x the target: re-shard
    assert mf.shard_count(1, 100, previous=None) == 1


def test_mid_size_data_sets_get_enough_shards_to_upload_in_parallel():
    mb = 1 << 20
    assert mf.shard_count(560 * mb, 256 * mb, previous=None, parallel=8) == 8  # 70 MB each, not 3 of 187 MB
    assert mf.shard_count(40 * mb, 256 * mb, previous=None, parallel=8) == 3  # but none below 16 MB
    assert mf.shard_count(140_000 * mb, 256 * mb, previous=None, parallel=8) == 547  # ImageNet: the size rules


def test_the_version_follows_content_and_the_manifest_streams_back_sorted(tmp_path):
    version, shards = shards_of(folder(tmp_path / "a", 20), tmp_path / "wa", 3)
    assert shards_of(folder(tmp_path / "b", 20), tmp_path / "wb", 3)[0] == version  # another folder, same content
    assert shards_of(folder(tmp_path / "c", 20, changed=3), tmp_path / "wc", 3)[0] != version
    with indexed(tmp_path / "a", tmp_path / "wa") as (index, _):
        header = {"format": mf.FORMAT, "dataset": "a", "version": index.plan_shards(3), "shard_count": 3}
        header |= {"files": 20, "bytes": sum(100 + i for i in range(20))}
        path = mf.write_manifest(index, header, tmp_path / "m.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 21 and lines[1:] == sorted(lines[1:])
    with mf.Manifest.load(path, tmp_path / "m.db") as manifest:
        assert manifest.header == header and len(manifest) == 20 and manifest.shards() == set(shards)
        assert {sid: set(manifest.shard_files(sid)) for sid in shards} == shards


def test_a_manifest_of_another_format_is_refused(tmp_path):
    (tmp_path / "old.json").write_text('{"format": 1, "files": []}')
    with pytest.raises(ValueError, match="manifest format 1 is not 2"):
        mf.Manifest.load(tmp_path / "old.json", tmp_path / "m.db")


def test_the_index_reads_only_new_or_changed_files_and_keeps_nothing_on_a_dry_run(tmp_path):
    folder(tmp_path / "d", 6)
    read = []

    def check(paths):
        read.extend(paths)
        return [(p, "bad") for p in paths if p.endswith("img 5.jpg")]

    with mf.scanned(tmp_path / "d", tmp_path / "w" / "index.sqlite", check, keep=True) as (index, fresh):
        assert fresh == 6 and index.bad() == [("train/c2/img 5.jpg", "bad")]
    (tmp_path / "d/train/c1/img 1.jpg").write_bytes(b"new")
    read.clear()
    with mf.scanned(tmp_path / "d", tmp_path / "w" / "index.sqlite", check, keep=False) as (index, fresh):
        assert fresh == 1 and read == [str(tmp_path / "d/train/c1/img 1.jpg")]
        assert index.bad() == [("train/c2/img 5.jpg", "bad")]  # remembered, not decoded again
    read.clear()
    with mf.scanned(tmp_path / "d", tmp_path / "w" / "index.sqlite", check, keep=True) as (index, fresh):
        assert fresh == 1  # the dry run above kept nothing
    (tmp_path / "d/train/c0/img 0.jpg").unlink()
    with mf.scanned(tmp_path / "d", tmp_path / "w" / "index.sqlite", check, keep=True) as (index, fresh):
        assert fresh == 0 and index.total()[0] == 5  # a removed file leaves the index


@pytest.mark.parametrize(
    "files, pair",
    [
        (("train/a/X.png", "train/a/x.png", "train/b/y.png"), ("train/a/X.png", "train/a/x.png")),
        (("train/Cat/a.png", "train/b/y.png", "train/cat/b.png"), ("train/Cat", "train/cat")),  # classes would merge
    ],
)
def test_the_index_refuses_names_that_differ_only_in_case(tmp_path, files, pair):
    for rel in files:
        write_image(tmp_path / "d" / rel)
    with (
        pytest.raises(BadInput, match=f"'{pair[0]}' and '{pair[1]}' differ only in letter case"),
        mf.scanned(tmp_path / "d", tmp_path / "i.sqlite", no_check, keep=False),
    ):
        pass


def test_case_clashes_are_found_in_file_and_folder_names():
    assert mf.case_clashes(["train/a/X.png", "train/a/x.png", "train/b/y.png"]) == [("train/a/X.png", "train/a/x.png")]
    assert mf.case_clashes(["train/Cat/a.png", "train/cat/b.png"]) == [
        ("train/Cat", "train/cat")
    ]  # classes would merge
    assert mf.case_clashes(["train/a/x.png", "train/b/X.png"]) == []
    assert mf.case_clashes(iter(["train/Cat/a.png", "train/b/y.png", "train/cat/b.png"])) == [
        ("train/Cat", "train/cat")
    ]


def test_the_listing_is_streamed_one_class_folder_at_a_time(tmp_path):
    """A folder of 1.33 million files is never held as one list: the first class's images come before the
    last class folder is even read (here, a last class that is not readable is found only when reached)."""
    for rel in ("train/a/x.png", "train/b/y.png", "train/c/z.png"):
        write_image(tmp_path / rel)
    (tmp_path / "train" / "c" / "notes.txt").write_text("not an image")
    paths = mf.relative_paths(tmp_path)
    assert [next(paths), next(paths)] == ["train/a/x.png", "train/b/y.png"]
    with pytest.raises(BadInput, match="notes.txt is not an image file"):
        next(paths)


def write_tree(root, files: dict[str, bytes]) -> list[mf.FileEntry]:
    out = []
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        out.append(mf.FileEntry(rel, len(data), mf.sha256_file(root / rel)))
    return out


def test_shards_are_reproducible_and_extraction_verifies(tmp_path):
    files = write_tree(tmp_path / "src", {"train/a/1.png": b"one", "train/b/ü 2.png": b"two" * 1000})
    mf.write_shard(tmp_path / "src", files, tmp_path / "s1.tar")
    mf.write_shard(tmp_path / "src", files, tmp_path / "s2.tar")
    assert (tmp_path / "s1.tar").read_bytes() == (tmp_path / "s2.tar").read_bytes()
    assert mf.extract_members(tmp_path / "s1.tar", iter(files), tmp_path / "out") == (3 + 3000, 2)
    assert (tmp_path / "out" / "train/b/ü 2.png").read_bytes() == b"two" * 1000
    assert mf.extract_members(tmp_path / "s1.tar", files[1:], tmp_path / "part") == (3000, 1)  # the rest is linked
    assert not (tmp_path / "part" / "train/a/1.png").exists()

    lying = [mf.FileEntry("train/a/1.png", 3, "0" * 64), files[1]]
    with pytest.raises(UntrustedInput, match="holds 'train/a/1.png' with another SHA-256 than the manifest's; nothing"):
        mf.extract_members(tmp_path / "s1.tar", lying, tmp_path / "out2")
    assert not (tmp_path / "out2" / "train/a/1.png").exists()  # what was written of it is gone
    size_lies = [mf.FileEntry("train/a/1.png", 4, files[0].sha256), files[1]]
    with pytest.raises(UntrustedInput, match="holds 'train/a/1.png' of 3 bytes, but the manifest says 4; nothing"):
        mf.extract_members(tmp_path / "s1.tar", size_lies, tmp_path / "out3")
    for i, extra in enumerate(("train/a/0.png", "train/a/2.png", "x.png")):  # before, between and after the members
        with pytest.raises(UntrustedInput, match=f"lacks files of the manifest, e.g. {extra}"):
            mf.extract_members(
                tmp_path / "s1.tar",
                sorted([*files, mf.FileEntry(extra, 1, "0")], key=lambda e: e.path),
                tmp_path / f"o{i}",  # a new version folder each time, as the sync makes one
            )


def test_a_file_changed_after_hashing_is_not_packed(tmp_path):
    files = write_tree(tmp_path / "src", {"train/a/1.png": b"one"})
    (tmp_path / "src" / "train/a/1.png").write_bytes(b"two")
    with pytest.raises(mf.ChangedWhileStaging, match="changed while it was being staged"):
        mf.write_shard(tmp_path / "src", files, tmp_path / "s.tar")


def test_sizes_match_reports_missing_and_short_files(tmp_path):
    write_tree(tmp_path, {"a": b"12"})
    assert mf.sizes_match(tmp_path, [("a", 2), ("b", 1), ("a", 3)]) == ["b", "a"]


@pytest.mark.parametrize(
    "name",
    [
        "train/a/new\nline.png",
        "train/a\r/x.png",
        "train/a/nul\x00.png",
        "train/a/x\u2029.png",
        os.fsdecode(b"train/a/caf\xe9.png"),
    ],
)
def test_names_that_cannot_be_staged_are_refused_by_the_trainers_rule(name):
    with pytest.raises(UsageError) as rule:
        check_name(name)
    with pytest.raises(BadInput) as refused:
        mf.check_names(["train/a/fine é 日本.png", name])
    assert str(refused.value) == str(rule.value) and len(str(refused.value).splitlines()) == 1


def test_printable_unicode_names_pass():
    mf.check_names(["train/chat noir é/日本語 名前.png", "train/a/emoji 🐈\u200d⬛.png", "val/a/ß.png"])


@pytest.mark.parametrize(
    "target, message",
    [("loop", "is a symlink loop"), ("../..", "is a symlink loop"), ("gone.png", "is a broken symlink")],
)
def test_listing_a_data_set_names_a_bad_link(tmp_path, target, message):
    for rel in ("train/a/x.png", "train/b/y.png"):
        write_image(tmp_path / rel)
    os.symlink(target, tmp_path / "train" / "a" / "loop")
    with pytest.raises(BadInput, match=f"^{tmp_path}/train/a/loop {message}"):
        list(mf.relative_paths(tmp_path))


def test_listing_a_data_set_refuses_a_name_with_a_newline(tmp_path):
    for rel in ("train/a/x.png", "train/b/two\nlines.png"):
        write_image(tmp_path / rel)
    with pytest.raises(BadInput, match=r"/train/b/two\\nlines.png' has a control character \('\\n'\)"):
        list(mf.relative_paths(tmp_path))
