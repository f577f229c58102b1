"""`trainflow predict`'s output options, refused before the model loads and before any image is classified."""

import pytest

from cli.predict import check_output
from infra.core.errors import BadInput


def test_a_csv_that_cannot_be_written_is_refused_before_anything_is_classified(tmp_path):
    with pytest.raises(BadInput, match=r"is a folder; pass a file name, e.g. --csv .*predictions.csv"):
        check_output(5, False, tmp_path)
    with pytest.raises(BadInput, match=r"there is no folder .*nowhere; pass a file in an existing folder"):
        check_output(5, False, tmp_path / "nowhere" / "p.csv")
    (tmp_path / "kept.csv").write_text("an earlier run's\n")
    check_output(5, False, tmp_path / "kept.csv")
    check_output(5, False, tmp_path / "new.csv")
    assert (tmp_path / "kept.csv").read_text() == "an earlier run's\n" and not (tmp_path / "new.csv").exists()
