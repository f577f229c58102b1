"""Whether the command is stopping: an interrupt came (Ctrl-C, SIGTERM, a closed terminal; flows/interrupts.py sets
it). From then on a step that fails is not retried (the re-run is the retry), a service that ends is not started
again (systemd and Kubernetes stop a service by sending SIGTERM to every one of its processes at once), and a
service's death is not reported as a fault."""

import threading

STOPPING = threading.Event()


def stopping(within: float = 0.0) -> bool:
    """Whether the command is stopping, waiting up to `within` seconds for it (a SIGTERM sent to every process at
    once reaches a service, which may end first, and this process's handler in the same instant)."""
    return STOPPING.wait(within) if within else STOPPING.is_set()


def failed(exc: BaseException) -> bool:
    """Whether `exc` ends a run as failed rather than interrupted: an error, not raised as the command stops. An
    interrupt (KeyboardInterrupt; Prefect's TerminationSignal, which a SIGTERM raises inside a flow run) is not, nor
    is a step's failure once the command is stopping (its workers were stopped by the same SIGTERM)."""
    return isinstance(exc, Exception) and not stopping()
