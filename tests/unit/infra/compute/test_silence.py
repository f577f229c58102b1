"""The watch over a quiet job: Horovod's stall warning, as its stall inspector writes it, ends the attempt naming
the missing ranks; silence ends it naming when each rank last printed."""

import threading

from infra.compute.silence import Silence, watched
from infra.engines.launchers import LaunchError

STALL = [  # horovod/common/stall_inspector.cc's warning as rank 0 prints it, through the rank shim
    "[rank 0] epoch 1 loss=0.5\n",
    "[rank 1] epoch 1 loss=0.5\n",
    "[rank 0] [2026-12-07 01:02:03.456: W /tmp/horovod/common/stall_inspector.cc:107] One or more tensors were "
    "submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for "
    "more than 60 seconds. This may indicate that different ranks are trying to submit different tensors or that only "
    "subset of ranks is submitting tensors, which will cause deadlock. \n",
    "[rank 0] Missing ranks:\n",
    "[rank 0] 1: [allreduce.noname.1, allreduce.noname.2]\n",
]


def test_horovods_stall_warning_stops_the_job_and_names_the_missing_ranks():
    stopped = threading.Event()
    silence = Silence(600, stopped.set)
    assert list(silence.lines(iter(STALL))) == STALL
    assert stopped.is_set()
    message = str(silence.error(LaunchError("training was killed by signal 15 (SIGTERM)")))
    assert message.startswith(
        "the job was stopped as hung: Horovod saw a collective that some ranks never joined (missing ranks 1); "
    )
    assert message.endswith("raise job.silent_s. training was killed by signal 15 (SIGTERM)")


def test_silence_stops_the_job_and_names_when_each_rank_last_printed():
    stopped = threading.Event()
    silence = watched(0.2, stopped.set)
    assert silence is not None
    list(silence.lines(iter(STALL[:2])))
    assert stopped.wait(30)  # the watch's own event: it stopped the job
    silence.done.set()
    message = str(silence.error(LaunchError("x")))
    assert message.startswith("the job was stopped as hung: no line from any rank for 0.2 s (rank 0 last printed ")
    assert "; rank 1 last printed " in message


def test_no_watch_without_a_limit():
    assert watched(0, lambda: None) is None
