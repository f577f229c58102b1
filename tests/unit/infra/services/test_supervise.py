"""The leash that stops a service when the process that started it dies, however it dies, and passes the service's
exit status and a kill through."""

import os
import signal
import subprocess
import sys
import time

import psutil

from infra.services.supervise import spawn


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


def test_a_service_may_run_below_the_starters_cpu_priority_and_a_launcher_does_not():
    said = [sys.executable, "-c", "import os; print(os.nice(0), flush=True)"]
    mine = os.nice(0)
    niced = spawn(said, nice=10, stdout=subprocess.PIPE, text=True)
    plain = spawn(said, stdout=subprocess.PIPE, text=True)
    said = [int(proc.stdout.readline()) for proc in (niced, plain)]  # read before stdin closes: the leash's end
    assert said == [min(mine + 10, 19), mine] and niced.wait() == plain.wait() == 0
