"""The suite timeline's report (tests/timeline.py) on records made here: how a worker's idle time is counted."""

from tests.timeline import Ran, idle, read


def test_a_worker_s_idle_time_is_what_the_span_leaves_of_its_tests():
    tests = [
        Ran("a.py::x", "gw0", start=10.0, stop=40.0, setup=1.0, call=28.0, teardown=1.0),
        Ran("a.py::y", "gw1", start=12.0, stop=20.0, setup=0.0, call=8.0, teardown=0.0),
        Ran("b.py::z", "gw1", start=25.0, stop=30.0, setup=0.0, call=5.0, teardown=0.0),
    ]
    assert idle(tests, start=0.0, end=50.0) == [("gw0", 30.0, 10.0, 0.0, 10.0), ("gw1", 13.0, 12.0, 5.0, 20.0)]
    assert read(["", '{"kind": "phase"}']) == [{"kind": "phase"}]
