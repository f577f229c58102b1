"""`trainflow bench install`'s figures: ratios within each round, who ran it, and caches that start empty."""

from pathlib import Path

from benchmarks.install import empty_home, lines, summarise
from benchmarks.report import install_chart


def test_pip_against_uv_is_a_ratio_within_each_round():
    result = summarise([{"pip": 100.0, "uv": 50.0}, {"pip": 120.0, "uv": 40.0}])
    assert result["pip_over_uv"]["all"] == [2.0, 3.0] and result["seconds"]["uv"]["median"] == 45.0
    assert lines(result)[-1].startswith("pip against uv, within each round: 2.50 (2.00–3.00)x the time; run as ")
    assert [label for label, _ in install_chart(result).bars] == ["base layer by pip", "base layer by uv"]


def test_the_demo_rounds_say_who_ran_them():
    result = summarise([{"demo": 200.0, "demo_again": 90.0}, {"demo": 220.0, "demo_again": 100.0}])
    assert "pip_over_uv" not in result and result["seconds"]["demo"]["median"] == 210.0
    assert lines(result) == [
        "make demo, fresh clone: 210 (200–220) s",
        "make demo, again: 95 (90–100) s",
        f"run as {'root' if result['as_root'] else 'a non-root user'}",
    ]
    assert [label for label, _ in install_chart(result).bars] == ["make demo, fresh clone", "make demo, again"]


def test_every_cache_of_the_timed_commands_lies_in_an_empty_home(tmp_path):
    env = empty_home(tmp_path)
    home = Path(env["HOME"])
    assert home.is_dir() and not any(home.iterdir())
    for cache in ("PIP_CACHE_DIR", "UV_CACHE_DIR", "npm_config_cache", "XDG_CACHE_HOME"):
        assert Path(env[cache]).is_relative_to(home), cache
