"""`trainflow bench install`'s figures: ratios within each round, who ran it, and caches that start empty."""

from pathlib import Path

import pytest

from benchmarks.install import User, empty_home, lines, summarise
from benchmarks.report import install_chart
from infra.core.errors import BadInput


def test_pip_against_uv_is_a_ratio_within_each_round():
    result = summarise([{"pip": 100.0, "uv": 50.0}, {"pip": 120.0, "uv": 40.0}], "root")
    assert result["pip_over_uv"]["all"] == [2.0, 3.0] and result["seconds"]["uv"]["median"] == 45.0
    assert lines(result)[-1] == "pip against uv, within each round: 2.50 (2.00–3.00)x the time; run as root"
    assert [label for label, _ in install_chart(result).bars] == ["base layer by pip", "base layer by uv"]


def test_the_demo_rounds_say_who_ran_them():
    result = summarise([{"demo": 200.0, "demo_again": 90.0}, {"demo": 220.0, "demo_again": 100.0}], "nobody")
    assert "pip_over_uv" not in result and result["seconds"]["demo"]["median"] == 210.0
    assert lines(result) == [
        "make demo, fresh clone: 210 (200–220) s",
        "make demo, again: 95 (90–100) s",
        "run as nobody (not root)",
    ]
    assert [label for label, _ in install_chart(result).bars] == ["make demo, fresh clone", "make demo, again"]


def test_every_cache_of_the_timed_commands_lies_in_an_empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    env = empty_home(tmp_path, User(None))
    assert "PYTHONPATH" not in env  # the timed commands import the clone's code, not this checkout's
    home = Path(env["HOME"])
    assert home.is_dir() and not any(home.iterdir())
    for cache in ("PIP_CACHE_DIR", "UV_CACHE_DIR", "npm_config_cache", "XDG_CACHE_HOME"):
        assert Path(env[cache]).is_relative_to(home), cache


def test_a_user_that_does_not_exist_is_one_line_naming_the_fix():
    with pytest.raises(BadInput, match="--user no-such-user-here: no such user on this machine; create it"):
        User("no-such-user-here")
