import pytest

from flows.bench.training import scaling_efficiency


def test_scaling_efficiency_is_two_worker_over_twice_one_worker():
    runs = [{"backend": "ddp", "workers": 1, "images_per_sec": 50.0},
            {"backend": "ddp", "workers": 2, "images_per_sec": 90.0},
            {"backend": "horovod", "workers": 1, "images_per_sec": 40.0}]
    assert scaling_efficiency(runs) == {"ddp": pytest.approx(0.9)}
