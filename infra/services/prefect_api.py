"""Prefect's API as trainflow serves it: uvicorn serving Prefect's app factory, as Prefect's own
`SubprocessASGIServer` (prefect/server/api/server.py) starts it, except that only SIGINT stops it.

    python infra/services/prefect_api.py APP_FACTORY PORT

trainflow stops its services with SIGINT first (infra/services/supervise.py `stop`). systemd and Kubernetes stop a
command by sending SIGTERM to every one of its processes at once: the server must outlive that long enough for the
interrupted flow run to record its end, and trainflow then stops it in order. The leash still stops it for sure
(SIGKILL after its grace) when trainflow is gone, and so does systemd's own SIGKILL.
Runs as a script, like the leash: it imports nothing of trainflow.
"""

import signal
import sys
from types import FrameType

import uvicorn


class StoppedBySigint(uvicorn.Server):
    """uvicorn's server, deaf to SIGTERM."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT:
            super().handle_exit(sig, frame)


def main(factory: str, port: int) -> None:
    config = uvicorn.Config(factory, factory=True, host="127.0.0.1", port=port, log_level="error", lifespan="on")
    StoppedBySigint(config).run()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
