"""What comes back from storage is input: a staged manifest's rows, a shard's members and a scripts version are
checked before anything is written or run (nodelib/staged/, nodelib/scripts.py)."""

import hashlib
import io
import json
import os
import re
import tarfile

import pytest

from nodelib.errors import UntrustedInput, UsageError
from nodelib.scripts import COMPLETE, HASHES, expected_version, scripts_version, version_problem
from nodelib.staged import names, rules, versions
from nodelib.staged.manifest import Manifest

GOOD = "train/cat/img 1.png"
SHA = "ab" * 32
SHARD = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "path, problem",
    [
        ("../../../../x", r"climbs out of the data set"),
        ("train/../../../x.png", r"climbs out of the data set"),
        ("/abs/path", r"is an absolute path"),
        ("C:/Windows/x.png", r"drive letter"),
        ("train\\cat\\x.png", r"backslash"),
        ("train/cat/x\0.png", r"NUL byte"),
        ("train//cat/x.png", r"not a normalised path"),
        ("train/./cat/x.png", r"not a normalised path"),
        ("train/cat/", r"not a normalised path"),
        (".manifest.jsonl", r"hidden file"),
        ("train/.git/x.png", r"hidden file"),
        ("scripts/abc/trainer/__init__.py", r"not under train/<class>/ or val/<class>/"),
        ("train/x.png", r"not under train/<class>/ or val/<class>/"),
        ("train/cat/a\nb.png", r"control character"),
        ("", r"not a file name"),
        (7, r"not a file name"),
    ],
)
def test_a_path_that_could_leave_its_version_folder_is_named(path, problem):
    assert re.search(problem, rules.path_problem(path) or "")


@pytest.mark.parametrize("path", [GOOD, "val/émeu/deep/er/x.JPEG", "train/a b/x..y.png", "train/c/x.png"])
def test_paths_staging_writes_pass(path):
    assert rules.path_problem(path) is None
    assert rules.row_problem([path, 3, SHA, SHARD]) is None


@pytest.mark.parametrize(
    "row, problem",
    [
        ([GOOD, 3, SHA], "is not a [path, size, sha256, shard] row"),
        ({"path": GOOD}, "is not a [path, size, sha256, shard] row"),
        ([GOOD, -1, SHA, SHARD], "the size -1, not a byte count"),
        ([GOOD, True, SHA, SHARD], "the size True, not a byte count"),
        ([GOOD, 3, "ABC", SHARD], "the digest 'ABC', not a SHA-256"),
        ([GOOD, 3, SHA, "../../x"], "in shard '../../x', not a hexadecimal id"),
        ([GOOD, 3, SHA, "/tmp/evil"], "in shard '/tmp/evil', not a hexadecimal id"),
    ],
)
def test_a_row_that_is_not_what_staging_writes_is_named(row, problem):
    assert problem in rules.row_problem(row)


def manifest_lines(rows, **header) -> list[bytes]:
    head = {"format": 2, "dataset": "pets", "version": "f" * 32, "shard_count": 1, "files": len(rows), "bytes": 9}
    return [json.dumps({**head, **header}).encode()] + [json.dumps(r).encode() for r in rows]


def test_a_tampered_manifest_is_refused_naming_the_data_set_the_line_and_the_fix():
    rows = [[GOOD, 3, SHA, SHARD], ["../../../../x", 3, SHA, SHARD]]
    with pytest.raises(UntrustedInput) as caught:
        Manifest.read(manifest_lines(rows), ":memory:", "pets")
    message = str(caught.value)
    assert message.startswith("staged data set 'pets' cannot be used: line 3 of its manifest.jsonl names")
    assert "'../../../../x', which climbs out of the data set (..)" in message
    assert message.endswith(
        "nothing of it was kept; delete datasets/pets/manifest.jsonl from the container, stage the data set again from "
        "its folder (`trainflow stage --data FOLDER`), and check who can write to the container"
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    "header, problem",
    [
        ({"dataset": "other"}, "line 1 of its manifest.jsonl names data set 'other', not 'pets'"),
        ({"version": "../../v"}, "has version '../../v', not a hexadecimal id"),
        ({"files": "many"}, "lacks a count"),
        ({"verified": {"check": "decode", "bad": [["/etc/passwd", "x"]]}}, "lists a bad file"),
    ],
)
def test_a_tampered_header_is_refused(header, problem):
    with pytest.raises(UntrustedInput, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Manifest.read(manifest_lines([[GOOD, 3, SHA, SHARD]], **header), ":memory:", "pets")


def test_a_manifest_that_lists_a_path_twice_or_is_not_json_is_refused():
    twice = [[GOOD, 3, SHA, SHARD], [GOOD, 3, SHA, SHARD]]
    with pytest.raises(UntrustedInput, match="lists one path on two rows"):
        Manifest.read(manifest_lines(twice), ":memory:", "pets")
    with pytest.raises(UntrustedInput, match="line 2 of its manifest.jsonl is not JSON"):
        Manifest.read([manifest_lines([])[0], b"{not json"], ":memory:", "pets")


def test_a_path_that_is_a_file_and_a_folder_or_a_name_too_long_is_refused_naming_it():
    """No folder on disk holds both, and no file system takes a 300-byte name: refused when the manifest is read,
    naming the data set and the path, not when the file server fails to write it."""
    clash = [["train/cat/a", 3, SHA, SHARD], ["train/cat/a/b.png", 3, SHA, SHARD]]
    with pytest.raises(UntrustedInput, match=r"'pets' cannot be used: its manifest.jsonl lists 'train/cat/a' both"):
        Manifest.read(manifest_lines(clash), ":memory:", "pets")
    sibling = [["train/cat/a", 3, SHA, SHARD], ["train/cat/a.png", 3, SHA, SHARD]]  # a name that begins the same
    assert len(Manifest.read(manifest_lines(sibling), ":memory:", "pets")) == 2
    long = [[f"train/cat/{'x' * 296}.png", 3, SHA, SHARD]]
    with pytest.raises(UntrustedInput, match=r"line 2 of its manifest.jsonl names .* has a name of 300 bytes, more"):
        Manifest.read(manifest_lines(long), ":memory:", "pets")


def shard_with(tmp_path, add) -> tuple:
    """A shard holding a regular file train/cat/a.png and whatever `add(tar)` puts beside it; the wanted entries."""
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("train/cat/a.png")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"one"))
        add(tar)
    wanted = [names.FileEntry("train/cat/a.png", 3, hashlib.sha256(b"one").hexdigest())]
    return path, wanted


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.DIRTYPE])
def test_a_shard_member_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    def add(tar):
        info = tarfile.TarInfo("train/cat/b.png")
        info.type, info.linkname = kind, "/etc/passwd"
        tar.addfile(info)

    path, wanted = shard_with(tmp_path, add)
    wanted.append(names.FileEntry("train/cat/b.png", 11, SHA))
    with pytest.raises(UntrustedInput, match=r"shard s.tar holds 'train/cat/b.png', which is not a regular file"):
        versions.extract_members(path, wanted, tmp_path / "out")
    assert not (tmp_path / "out" / "train/cat/b.png").exists() and not os.path.lexists("/etc/passwd.png")


def test_a_file_is_never_written_through_a_link_in_the_version_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "v"
    (dest / "train").mkdir(parents=True)
    (dest / "train" / "cat").symlink_to(outside)
    with pytest.raises(UntrustedInput, match="'train/cat/a.png' resolves outside the version folder"):
        versions.write_member(dest, "train/cat/a.png", io.BytesIO(b"x"))
    assert list(outside.iterdir()) == []
    (dest / "train" / "dog").mkdir()
    (dest / "train" / "dog" / "a.png").symlink_to(outside / "planted")
    with pytest.raises(FileExistsError):
        versions.write_member(dest, "train/dog/a.png", io.BytesIO(b"x"))
    assert not (outside / "planted").exists()


@pytest.mark.parametrize("name", ["../../../escaped-ds", "..", ".", "a/b", "", "-x", "x" * 101, "bad name"])
def test_a_data_set_name_that_is_not_one_folder_is_refused(name):
    with pytest.raises(UsageError, match="is not a name: use letters, digits"):
        names.check_dataset_name(name)


@pytest.mark.parametrize("name", ["pets", "ImageNet_2012", "digits-32", "v1.2"])
def test_data_set_names_pass(name):
    assert names.check_dataset_name(name) == name


def version_folder(root, files: dict[str, bytes]):
    """A scripts version as the upload step writes it: the files, .hashes.json, .complete; named after its digest."""
    hashes = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    folder = root / "scripts" / scripts_version(hashes)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / HASHES).write_text(json.dumps(hashes))
    (folder / COMPLETE).write_text(folder.name)
    return folder


FILES = {"trainer/__init__.py": b'"""doc"""\n', "trainer/train.py": b"print('train')\n", "labels.txt": b"cat\n"}


def test_an_intact_scripts_version_passes_and_python_caches_are_not_its_files(tmp_path):
    folder = version_folder(tmp_path, FILES)
    (folder / "trainer" / "__pycache__").mkdir()
    (folder / "trainer" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"never read from the share")
    assert expected_version(folder) == folder.name and version_problem(folder, folder.name) is None


@pytest.mark.parametrize(
    "tamper, problem",
    [
        (lambda f: (f / "trainer/__init__.py").write_text("import os\n"), "trainer/__init__.py was changed"),
        (lambda f: (f / "trainer/evil.py").write_text("x = 1\n"), "trainer/evil.py was added to it"),
        (lambda f: (f / "labels.txt").unlink(), "labels.txt is missing from it"),
        (lambda f: (f / HASHES).write_text(json.dumps({"trainer/train.py": "0" * 64})), "its .hashes.json was changed"),
        (lambda f: (f / HASHES).unlink(), "its .hashes.json, the digests the version is named after, is missing"),
    ],
)
def test_a_changed_scripts_version_is_named(tmp_path, tamper, problem):
    folder = version_folder(tmp_path, FILES)
    tamper(folder)
    assert problem in version_problem(folder, folder.name)


def test_a_folder_mounted_under_another_name_is_checked_against_its_complete_mark(tmp_path):
    folder = version_folder(tmp_path, FILES)
    mounted = tmp_path / "INPUT_scripts"
    folder.rename(mounted)
    assert expected_version(mounted) == folder.name and version_problem(mounted, folder.name) is None
    assert expected_version(tmp_path) is None  # not a scripts version (a checkout's containers/): not checked


@pytest.mark.parametrize(
    "path, problem",
    [
        ("../x.csv", r"climbs out of the data set"),
        ("/etc/passwd", r"is an absolute path"),
        ("images/.hidden.png", r"hidden file"),
        ("masks//a.png", r"not a normalised path"),
    ],
)
def test_the_files_layout_takes_any_relative_path_and_still_refuses_one_that_leaves(path, problem):
    assert re.search(problem, rules.path_problem(path, "files") or "")
    assert rules.path_problem("meta.csv", "files") is None and rules.path_problem("images/deep/0.png", "files") is None
    assert rules.path_problem("meta.csv") == "is not under train/<class>/ or val/<class>/"


def test_a_manifest_in_the_files_layout_says_so_and_an_unknown_layout_is_refused():
    rows = [["images/0.png", 3, SHA, SHARD], ["meta.csv", 3, SHA, SHARD]]
    manifest = Manifest.read(manifest_lines(rows, layout="files"), ":memory:", "pets")
    assert [row[0] for row in manifest.rows()] == ["images/0.png", "meta.csv"]
    with pytest.raises(UntrustedInput, match="line 2 of its manifest.jsonl names 'images/0.png', which is not under"):
        Manifest.read(manifest_lines(rows), ":memory:", "pets")  # no layout: the ImageNet layout's rules
    with pytest.raises(UntrustedInput, match="has layout 'any', not one of imagenet, files"):
        Manifest.read(manifest_lines(rows, layout="any"), ":memory:", "pets")


def test_a_file_at_the_top_of_the_version_folder_is_written_and_a_link_there_is_not_followed(tmp_path):
    dest = tmp_path / "v"
    dest.mkdir()
    versions.write_member(dest, "meta.csv", io.BytesIO(b"id\n"))
    assert (dest / "meta.csv").read_bytes() == b"id\n"
    (dest / "planted.csv").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        versions.write_member(dest, "planted.csv", io.BytesIO(b"x"))
