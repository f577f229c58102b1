"""Two folders of one name in one workdir would stage the same data set (its name is the folder's): the second is
refused before anything starts, unless named, and a folder moved elsewhere is still the same data set."""

import pytest

from flows.config import ConfigError, load_config
from flows.dataset import remember_source, sources_file, with_data
from tests.fakes.image_files import write_image


def folder_of_images(root):
    for name in ("a", "b"):
        write_image(root / "train" / name / "x.png")
    return root


def config(tmp_path, data, **settings):
    return load_config(None, {"workdir": tmp_path / "w", "data": str(data), **settings}, environ={})


def test_a_second_folder_of_the_same_name_is_refused_unless_named(tmp_path):
    first, second = folder_of_images(tmp_path / "one" / "data"), folder_of_images(tmp_path / "two" / "data")
    remember_source(with_data(config(tmp_path, first)))  # what staging it records
    assert with_data(config(tmp_path, first)).data == str(first)  # the same folder again: fine
    with pytest.raises(ConfigError) as refused:
        with_data(config(tmp_path, second))
    assert str(refused.value) == (
        f"data set 'data' of workdir {tmp_path / 'w'} was staged from {first}; {second} has the same folder name and "
        "would replace it: name this one with dataset: NAME (TRAINFLOW_DATASET=NAME), or use another --workdir"
    )
    assert with_data(config(tmp_path, second, dataset="data-two")).dataset_name() == "data-two"


def test_a_folder_moved_elsewhere_is_the_same_data_set(tmp_path):
    first = folder_of_images(tmp_path / "one" / "data")
    remember_source(with_data(config(tmp_path, first)))
    moved = first.rename(tmp_path / "data")
    assert with_data(config(tmp_path, moved)).data == str(moved)
    assert sources_file(config(tmp_path, moved)).exists()
