"""A real terminal for a command: a pseudo-terminal whose slave side is the command's controlling terminal and its
standard input, output and error, as a terminal window's shell gives its foreground command. Closing the master side
is closing the window: the kernel hangs the terminal up, sends SIGHUP to the command (the session's leader), and
every later write to it fails with EIO."""

import os
import select
import subprocess
import sys
import time

# Made the session's leader by Popen (start_new_session), the command takes the terminal on its stdin as its
# controlling terminal (TIOCSCTTY), then becomes the command itself, with the hang-up signal at its default, as a
# terminal's shell starts it: a suite started under nohup would otherwise pass its ignored SIGHUP on, and the command
# would rightly go on as under nohup.
TAKE_TERMINAL = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)


class Terminal:
    """`cmd` running in a terminal of its own; `read_until` reads what it shows, `close` closes the window."""

    def __init__(self, cmd: list[str], **popen):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TAKE_TERMINAL, *cmd],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            **popen,
        )
        os.close(slave)
        self.shown = ""

    def read_until(self, text: str, seconds: float = 240) -> str:
        """What the terminal shows until `text` appears (AssertionError past `seconds`, or if the command ends)."""
        deadline = time.monotonic() + seconds
        while text not in self.shown:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} within {seconds} s:\n{self.shown[-3000:]}"
            if select.select([self.master], [], [], min(left, 1))[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the command closed the terminal's last slave descriptor (it ended)
                    chunk = b""
                assert chunk, f"ended before {text!r}:\n{self.shown[-3000:]}"
                self.shown += chunk.decode(errors="replace")
        return self.shown

    def close(self) -> float:
        """Close the window; the time it was closed."""
        os.close(self.master)
        return time.monotonic()
