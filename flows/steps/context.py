"""What the steps of one walk share (flows/steps/__init__.py walks them): the config, and what each step leaves for
the later ones: its action's results on a run, its decision's on the dry run."""

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from flows.config import FlowConfig
from infra.compute import RunPaths
from nodelib.staged.manifest import Manifest


@dataclass
class Context:
    """One walk: the config, the steps walked and the run's id. What a step opens for the rest of the walk (Azurite,
    the run's record) goes on `stack`, which closes after the last step. Each field below it is set by the step
    named first in its comment; a later step reads it."""

    cfg: FlowConfig
    steps: list[ModuleType]
    run_id: str  # the flow run's id; the run's own once the record step opened it (a resumed run keeps its first)
    stack: ExitStack = field(default_factory=ExitStack)
    port: int | None = None  # endpoint: Azurite's port; None for Azure storage
    image: str | None = None  # image: the reference the nodes (or the sync job) run; None where no step runs one
    scripts: str = ""  # scripts: the version's folder on the file share, scripts/<version>
    staged: dict[str, dict] = field(default_factory=dict)  # scripts, dataset, sync: what each moved, by the
    # name the staging flow returns it under ("scripts", "upload", "sync")
    manifest: Manifest | None = None  # dataset, on the dry run: the manifest the upload would write
    unready: str = ""  # dataset, on the dry run: why it has no manifest to plan on (the digits set unwritten, the
    # shrunk copy out of date): the sync's decision too
    data: Path = field(init=False)  # sync: the data set version the job reads
    inputs: str = field(init=False)  # record: the run's fingerprint
    resumed: bool = False  # record: the run resumes an unfinished one with the same inputs
    run: RunPaths = field(init=False)  # record: the run's paths
    tracked: dict | None = None  # record: the MLflow run the engine logs into; None without tracking
    pool: dict = field(init=False)  # training: the pool's description
    trained: dict = field(init=False)  # training: the metrics, the job's command, its attempts
    receipt: dict = field(init=False)  # results: what was trained, from what
    results: dict = field(init=False)  # results: where they went
    done: list[dict] = field(default_factory=list)  # every step, as it ends: what it did (`did`), for the summary

    def did(self, plan: dict, moved: dict | None = None) -> None:
        """Record a step's end: its decision (a step_plan row: ran or skipped, and why) and, for a transfer, the
        files and megabytes it moved and its seconds."""
        moved = moved or {}
        self.done.append(
            {
                "step": plan["step"],
                "did": "ran" if plan["action"] == "run" else "skipped",
                "why": plan["detail"],
                **{key: moved[key] for key in ("files", "MB", "seconds") if key in moved},
            }
        )

    @property
    def folder(self) -> Path:
        """The data the config names, as a path: a folder (or "staged", "synthetic")."""
        assert self.cfg.data is not None  # the command, or the dry run, names the data before a walk
        return Path(self.cfg.data)

    def each(self, part: str) -> list[Callable]:
        """The steps' `part` functions in order, of the steps that have one."""
        return [getattr(step, part) for step in self.steps if hasattr(step, part)]


def share_url(cfg: FlowConfig) -> str:
    """The file share's URL, as the storage operations name it."""
    return f"{cfg.fileshare.account_url}/{cfg.fileshare.share}"


def container_url(cfg: FlowConfig) -> str:
    """The Blob container's URL, as the storage operations name it."""
    return f"{cfg.storage.account_url}/{cfg.storage.container}"
