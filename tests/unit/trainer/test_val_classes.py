"""A val/ class folder that train/ lacks is refused in one line by every reader of the layout (the staging step's
walk and the trainer's index alike), naming the folders, a near miss in case, and the fix."""

import pytest

from nodelib import layout
from nodelib.errors import UsageError
from tests.fakes.image_files import write_image


def folder(root, train: str, val: list[str]):
    """A data folder with one image in each train/ class (one letter each) and each val/ class named in `val`."""
    for name in [*train, *(f"../val/{v}" for v in val)]:
        write_image(root / "train" / name / "x.png")
    return root


@pytest.mark.parametrize("read", [lambda d: list(layout.folder_images(d)), layout.index_folder])
def test_a_val_class_that_train_lacks_is_refused_by_name_before_any_file_is_listed(tmp_path, read):
    data = folder(tmp_path, "ab", ["a", "zebra"])
    with pytest.raises(UsageError) as refused:
        read(data)
    assert str(refused.value) == (
        f"{data / 'val'} has a class folder that train/ lacks: zebra; rename it to train/'s class names, add it "
        "to train/, or remove it"
    )


def test_a_val_class_that_differs_only_in_case_is_named_with_train_s(tmp_path):
    data = folder(tmp_path, "ab", ["A", "b"])
    with pytest.raises(UsageError, match=r"lacks: A \(train/ has a: class names are case-sensitive\); rename it"):
        next(layout.folder_images(data))


def test_many_unknown_val_classes_are_counted_after_the_first_five(tmp_path):
    data = folder(tmp_path, "ab", list("cdefghi"))
    with pytest.raises(UsageError, match=r"class folders that train/ lacks: c, d, e, f, g and 2 more; rename them"):
        next(layout.folder_images(data))
