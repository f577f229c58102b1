"""bench loader's figures from measured-shaped rounds: the runs on the shrunk JPEGs are compared with pil on the
original JPEGs, the headline ratio is computed within each round (not as a ratio of medians), and a --max-side too
small to crop from is refused before anything is written."""

import pytest

from benchmarks.common import RESTARTS
from benchmarks.loader import PARTS, bench_loader, headline, shrunk_name, summarise
from flows.config import ConfigError, FlowConfig
from infra.engines.pytorch import PyTorchTraining

HEADLINE = shrunk_name(RESTARTS, 500)
# images/s on 1 core and on 2, per round; on 2 cores the ratio within each round (3.2, 2.0, 1.5: median 2.0) differs
# from the ratio of the medians (480 / 200 = 2.4)
RATES = [
    {"pil": (100.0, 150.0), "fast": (200.0, 300.0), HEADLINE: (300.0, 480.0), "pil@500": (110.0, 160.0)},
    {"pil": (150.0, 300.0), "fast": (300.0, 600.0), HEADLINE: (480.0, 600.0), "pil@500": (160.0, 310.0)},
    {"pil": (200.0, 200.0), "fast": (400.0, 400.0), HEADLINE: (680.0, 300.0), "pil@500": (210.0, 210.0)},
]


def rounds() -> list[dict]:
    return [
        {
            "rates": {f"{name}/{n}": rates[name][n - 1] for name in rates for n in (1, 2)},
            "parts": {name: dict.fromkeys(PARTS, 0.002) for name in rates},
        }
        for rates in RATES
    ]


def test_every_shrunk_run_is_compared_with_pil_on_the_originals_within_each_round():
    result = summarise(rounds(), 2, 512, PyTorchTraining())
    assert set(result["speedup_per_core"]) == {"fast", HEADLINE, "pil@500"}
    assert result["speedup_per_core"]["pil@500"]["1"]["all"] == pytest.approx([1.1, 160 / 150, 1.05])
    top = headline(result, HEADLINE)
    assert top["run"] == HEADLINE and top["against"] == "pil"
    assert top["per_core"]["1"]["all"] == pytest.approx([3.0, 3.2, 3.4])
    assert (top["per_core"]["1"]["median"], top["per_core"]["1"]["min"]) == pytest.approx((3.2, 3.0))
    assert top["per_core"]["2"]["all"] == pytest.approx([3.2, 2.0, 1.5])  # per core: both divide by 2 cores
    assert top["per_core"]["2"]["median"] == pytest.approx(2.0)  # not 2.4


def test_a_shrunk_run_is_named_after_its_loader_and_the_longer_side():
    assert shrunk_name("fast", 500) == "fast@500" and HEADLINE == "fast+restarts@500"


def test_a_longer_side_too_small_to_crop_from_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="max_side must be a whole number of pixels, at least 32 .* not 10"):
        bench_loader(FlowConfig(workdir=tmp_path / "w"), None, files=8, max_side=10)
    assert not (tmp_path / "w").exists()
