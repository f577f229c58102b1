"""Shards and manifests: what changes when one file changes, and what stays."""

import os

import pytest

from infra import manifest as mf
from infra.errors import BadInput
from infra.jsonfiles import read_json, write_json
from tests.conftest import write_image
from trainer.errors import UsageError
from trainer.layout import check_name


def entries(n: int, changed: int | None = None) -> list[mf.FileEntry]:
    return [mf.FileEntry(f"train/c{i % 3}/img {i}.jpg", 100 + i, ("f" if i == changed else "0") * 64) for i in range(n)]


def test_one_changed_file_changes_exactly_one_shard():
    before, after = mf.assign_shards(entries(200), 8), mf.assign_shards(entries(200, changed=17), 8)
    assert len(before) == 8
    assert len(set(before) - set(after)) == 1 and len(set(after) - set(before)) == 1
    (new,) = set(after) - set(before)
    assert "train/c2/img 17.jpg" in {e.path for e in after[new]}


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


def test_manifest_version_follows_content_not_order():
    shards = mf.assign_shards(entries(20), 3)
    again = mf.assign_shards(list(reversed(entries(20))), 3)
    assert mf.build_manifest("d", shards, 3)["version"] == mf.build_manifest("d", again, 3)["version"]
    assert mf.build_manifest("d", mf.assign_shards(entries(20, changed=3), 3), 3)["version"] != \
        mf.build_manifest("d", shards, 3)["version"]
    manifest = mf.build_manifest("d", shards, 3)
    assert mf.parse_manifest(mf.manifest_bytes(manifest).decode()) == manifest
    assert {f["shard"] for f in manifest["files"]} == set(shards)


def test_case_clashes_are_found_in_file_and_folder_names():
    assert mf.case_clashes(["train/a/X.png", "train/a/x.png", "train/b/y.png"]) == [("train/a/X.png", "train/a/x.png")]
    assert mf.case_clashes(["train/Cat/a.png", "train/cat/b.png"]) == [("train/Cat", "train/cat")]  # classes would merge
    assert mf.case_clashes(["train/a/x.png", "train/b/X.png"]) == []


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
    wanted = {e.path: e for e in files}
    assert mf.extract_members(tmp_path / "s1.tar", wanted, tmp_path / "out") == 3 + 3000
    assert (tmp_path / "out" / "train/b/ü 2.png").read_bytes() == b"two" * 1000

    lying = {**wanted, "train/a/1.png": mf.FileEntry("train/a/1.png", 3, "0" * 64)}
    with pytest.raises(ValueError, match="does not match the manifest"):
        mf.extract_members(tmp_path / "s1.tar", lying, tmp_path / "out2")
    with pytest.raises(ValueError, match="lacks 1 files"):
        mf.extract_members(tmp_path / "s1.tar", {**wanted, "x.png": mf.FileEntry("x.png", 1, "0")}, tmp_path / "o3")


def test_hash_cache_rehashes_only_changed_files(tmp_path):
    write_tree(tmp_path, {"train/a/1.png": b"1", "train/a/2.png": b"2"})
    paths = ["train/a/1.png", "train/a/2.png"]
    first, fresh, cache = mf.hash_files(tmp_path, paths, {})
    assert len(fresh) == 2
    write_json(tmp_path / "cache.json", cache)
    (tmp_path / "train/a/2.png").write_bytes(b"22")
    second, fresh, _ = mf.hash_files(tmp_path, paths, read_json(tmp_path / "cache.json"))
    assert fresh == ["train/a/2.png"] and second[0] == first[0] and second[1] != first[1]


def test_an_unreadable_hash_cache_counts_as_empty(tmp_path):
    (tmp_path / "cache.json").write_text('{"train/a/1.png": ["3:1')
    assert read_json(tmp_path / "cache.json") == {} and read_json(tmp_path / "missing.json") == {}


def test_a_file_changed_after_hashing_is_not_packed(tmp_path):
    files = write_tree(tmp_path / "src", {"train/a/1.png": b"one"})
    (tmp_path / "src" / "train/a/1.png").write_bytes(b"two")
    with pytest.raises(mf.ChangedWhileStaging, match="changed while it was being staged"):
        mf.write_shard(tmp_path / "src", files, tmp_path / "s.tar")


def test_the_manifest_records_the_bucket_count_not_the_non_empty_buckets():
    shards = mf.assign_shards(entries(3), 8)
    assert len(shards) <= 3 and mf.build_manifest("d", shards, 8)["shard_count"] == 8


def test_sizes_match_reports_missing_and_short_files(tmp_path):
    write_tree(tmp_path, {"a": b"12"})
    assert mf.sizes_match(tmp_path, [{"path": "a", "size": 2}, {"path": "b", "size": 1}, {"path": "a", "size": 3}]) == ["b", "a"]


@pytest.mark.parametrize("name", ["train/a/new\nline.png", "train/a\r/x.png", "train/a/nul\x00.png", "train/a/x\u2029.png",
                                  os.fsdecode(b"train/a/caf\xe9.png")])
def test_names_that_cannot_be_staged_are_refused_by_the_trainers_rule(name):
    with pytest.raises(UsageError) as rule:
        check_name(name)
    with pytest.raises(BadInput) as refused:
        mf.check_names(["train/a/fine é 日本.png", name])
    assert str(refused.value) == str(rule.value) and len(str(refused.value).splitlines()) == 1


def test_printable_unicode_names_pass():
    mf.check_names(["train/chat noir é/日本語 名前.png", "train/a/emoji 🐈\u200d⬛.png", "val/a/ß.png"])


@pytest.mark.parametrize("target, message", [("loop", "is a symlink loop"), ("../..", "is a symlink loop"),
                                             ("gone.png", "is a broken symlink")])
def test_listing_a_data_set_names_a_bad_link(tmp_path, target, message):
    for rel in ("train/a/x.png", "train/b/y.png"):
        write_image(tmp_path / rel)
    os.symlink(target, tmp_path / "train" / "a" / "loop")
    with pytest.raises(BadInput, match=f"^{tmp_path}/train/a/loop {message}"):
        mf.relative_paths(tmp_path)


def test_listing_a_data_set_refuses_a_name_with_a_newline(tmp_path):
    for rel in ("train/a/x.png", "train/b/two\nlines.png"):
        write_image(tmp_path / rel)
    with pytest.raises(BadInput, match=r"/train/b/two\\nlines.png' has a control character \('\\n'\)"):
        mf.relative_paths(tmp_path)
