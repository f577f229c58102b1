import math

import pytest

from trainer.schedule import Schedule, lr_factor


def test_warmup_ramps_from_one_worker_rate_to_scaled_rate():
    s = Schedule(steps_per_epoch=10, epochs=20, world_size=4, warmup_epochs=5)
    assert lr_factor(0, s) == 1.0
    assert lr_factor(25, s) == pytest.approx(2.5)  # half way through warmup
    assert lr_factor(50, s) == pytest.approx(4.0)  # warmup done: linear scaling rule


def test_step_schedule_divides_by_ten_at_each_decay_epoch():
    s = Schedule(steps_per_epoch=1, epochs=90, world_size=2, kind="step", decay_epochs=(30, 60))
    assert [lr_factor(e, s) for e in (0, 29, 30, 59, 60)] == pytest.approx([2, 2, 0.2, 0.2, 0.02])


def test_cosine_decays_to_zero_at_the_end():
    s = Schedule(steps_per_epoch=100, epochs=10, world_size=2, warmup_epochs=1)
    factors = [lr_factor(step, s) for step in range(100, 1001, 100)]
    assert factors[0] == pytest.approx(2.0)
    assert factors[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(factors, factors[1:]))
    assert lr_factor(550, s) == pytest.approx(1.0)  # mid-way: half the peak
    assert not math.isnan(lr_factor(10**6, s))
