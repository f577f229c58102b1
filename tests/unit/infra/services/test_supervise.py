"""The leash that stops a service when the process that started it dies, however it dies, and passes the service's
exit status and a kill through."""

import os
import signal
import subprocess
import sys
import time

import psutil

from infra.services.supervise import running_service, spawn


def test_a_leashed_service_dies_with_the_process_that_started_it_however_it_ends():
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from infra.services.supervise import spawn; p = spawn(['sleep', '300']); "
                "print(p.pid, flush=True); time.sleep(300)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    leash = psutil.Process(int(starter.stdout.readline()))
    while not leash.children():
        time.sleep(0.05)
    service = leash.children()[0]
    assert os.getpgid(service.pid) == leash.pid != os.getpgid(starter.pid)  # its own group: Ctrl-C misses it
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    gone, alive = psutil.wait_procs([leash, service], timeout=10)
    assert not alive


def test_the_leash_passes_the_exit_status_and_a_kill_through(tmp_path):
    assert spawn(["sh", "-c", "exit 3"]).wait() == 3
    proc = spawn(["sleep", "30"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_a_service_runs_below_the_starters_cpu_priority_once_ready_every_thread_of_it(tmp_path):
    threads = "import threading, time; [threading.Thread(target=time.sleep, args=(60,)).start() for _ in range(3)]"
    with running_service([sys.executable, "-c", threads], tmp_path / "log", lambda: True, "sleeper", 10, nice=10) as s:
        while len(psutil.Process(s.pid).threads()) < 4:
            time.sleep(0.05)
        s.yield_cpu()  # the threads started after it was ready (here: after running_service lowered it)
        tids = [t.id for t in psutil.Process(s.pid).threads()]
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in tids} == {min(os.nice(0) + 10, 19)}
