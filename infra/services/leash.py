"""Run a command on a leash: it dies with the process that started it, however that process ends.

    python infra/services/leash.py CMD [ARGS...]     (stdin: a pipe whose other end the starting process holds)

Services and launchers run in their own session, so that the terminal's Ctrl-C reaches trainflow alone
and trainflow stops them in order. But a session of their own also lets them outlive trainflow when it is
killed outright (SIGKILL leaves no time for a `finally`). The leash closes that gap: it starts CMD in its
own process group, and when its stdin reaches end-of-file (the kernel closes the pipe when the starting
process dies, whatever kills it) it stops the whole group. It passes CMD's exit status through, and ignores
SIGINT and SIGTERM itself, so that stopping the group stops CMD and the leash then exits with CMD's status.
Standard library only: it runs before anything is imported.
"""

import os
import signal
import subprocess
import sys
import threading

GRACE_SECONDS = 5


def stop_group_when_released(group: int) -> None:
    """Block until stdin closes (the starting process is gone), then stop the group: SIGTERM, then SIGKILL."""
    try:
        while os.read(0, 1024):
            pass
    except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        threading.Event().wait(GRACE_SECONDS)


def main(argv: list[str]) -> int:
    """Start argv[0] with its arguments, watch stdin, and exit as the command did."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        restore_signals=True,
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)],
    )
    threading.Thread(target=stop_group_when_released, args=(os.getpgid(0),), daemon=True).start()
    code = child.wait()
    if code < 0:  # killed by a signal: end the same way, so the starting process sees what happened
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
