"""Experiment trackers: each iteration's scalars sent to TensorBoard, W&B, MLflow or the log.

``monitoring.loggers`` names the trackers (as verl's ``trainer.logger``); :func:`open_trackers`
opens them and returns one :class:`Trackers` that fans every call out to each. The scalars are
the numeric values of the iteration's ``metrics.jsonl`` record under the same namespaced keys
(``charts/episode_return``, ``charts/best_score``, ``losses/kl``, ``charts/clipfrac``,
``policy/update_tv``, ``time/train``...; :mod:`aflowrl.trainer.records` lists them), logged at
step = the iteration. Non-finite values are left out.

- ``console``: one log line per iteration with the update diagnostics (the progress line already
  shows the return and best score);
- ``tensorboard``: event files under ``monitoring.tensorboard.dir`` (default
  ``<run dir>/tensorboard``), written with tensorboardX (no torch needed, so the trainer's image
  writes them too);
- ``wandb``: a W&B run (``monitoring.wandb``; mode "offline" needs no network), the resolved
  spec as its config; the API key comes from :mod:`aflowrl.envs`, never from the spec;
- ``mlflow``: an MLflow run in ``monitoring.mlflow.trackingUri`` (default the file store
  ``<run dir>/mlruns``), the resolved spec as its ``spec.yaml`` artifact.

A tracker whose library is missing is a configuration error naming the extra to install
(:func:`check_available`, called before any service starts). A tracker that fails while the run
goes on is logged and dropped: tracking never stops a training run. Each start of the trainer
(a resumed run too) opens new W&B and MLflow runs. A resumed run first sends its last recorded
iteration again, so that a stop between that iteration's checkpoint and its tracker call loses
nothing; in TensorBoard this starts a new session at that step, which replaces the steps it
repeats. Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from aflowrl import envs
from aflowrl.config import RunSpec
from aflowrl.errors import InvalidInputError

logger = logging.getLogger(__name__)

EXTRA = "tracking"
"""The optional dependency group that brings W&B and MLflow."""

_LIBRARIES = {
    "tensorboard": ("tensorboardX", "env"),
    "wandb": ("wandb", EXTRA),
    "mlflow": ("mlflow", EXTRA),
}
"""Logger name -> (module it imports, the extra of aflow-rl that installs it)."""

CONSOLE_KEYS = (
    ("losses/kl", "kl"),
    ("charts/approx_kl", "approx_kl"),
    ("charts/clipfrac", "clipfrac"),
    ("policy/update_tv", "tv"),
    ("policy/entropy", "entropy"),
    ("charts/grad_norm", "grad_norm"),
    ("charts/advantage_std", "adv_std"),
)
"""Scalars of the console line, with their short names."""


class Tracker(Protocol):
    """One experiment tracker."""

    name: str

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record ``scalars`` at ``step`` (the iteration)."""

    def close(self) -> None:
        """Flush and release everything (called once)."""


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a ``metrics.jsonl`` record, by key (``iteration`` is the step)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "iteration" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(float(value)):
            out[key] = float(value)
    return out


def check_available(loggers: Sequence[str]) -> None:
    """Raise a one-line configuration error for a selected tracker whose library is missing."""
    for name in loggers:
        if name not in _LIBRARIES:
            continue
        module, extra = _LIBRARIES[name]
        if importlib.util.find_spec(module) is None:
            raise InvalidInputError(
                f"logger {name!r} needs the {module} package: pip install 'aflow-rl[{extra}]'",
                field="spec.monitoring.loggers",
            )


def run_name(run_dir: Path) -> str:
    """The TrainingRun's name in a pod, else the run directory's name."""
    return envs.AFLOWRL_RUN_NAME or run_dir.resolve().name or "aflowrl"


class ConsoleTracker:
    """The update diagnostics as one log line per iteration."""

    name = "console"

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        parts = [f"{short} {scalars[key]:.4g}" for key, short in CONSOLE_KEYS if key in scalars]
        if parts:
            logger.info("iteration %d update: %s", step + 1, "  ".join(parts))

    def close(self) -> None:
        return None


class TensorBoardTracker:
    """Event files in one directory (tensorboardX's writer)."""

    name = "tensorboard"

    def __init__(self, logdir: Path, *, flush_s: float) -> None:
        from tensorboardX import SummaryWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        # Files are read in name order, and a name holds the second it was opened: the suffix
        # keeps a restart within the same second a new file, after the earlier one.
        self._writer = SummaryWriter(
            logdir=str(logdir),
            flush_secs=max(1, round(flush_s)),
            filename_suffix=f".{time.time_ns()}",
        )
        self._started = False

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if not self._started:
            self._start_session(step)
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def _start_session(self, step: int) -> None:
        """Mark a (re)start at ``step``: TensorBoard's reader drops the events of an earlier
        session at ``step`` and after, so a resumed run's repeated iterations replace them."""
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        start = Event(
            wall_time=time.time(), step=step, session_log=SessionLog(status=SessionLog.START)
        )
        self._writer._get_file_writer().add_event(start)  # no public call writes a SessionLog
        self._started = True

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A W&B run (online, or offline under its directory)."""

    name = "wandb"

    def __init__(self, spec: RunSpec, run_dir: Path) -> None:
        import wandb

        settings = spec.monitoring.wandb
        root = Path(settings.dir) if settings.dir else run_dir
        root.mkdir(parents=True, exist_ok=True)
        key = envs.WANDB_API_KEY
        if settings.mode == "online" and not key:
            raise InvalidInputError(
                "logger 'wandb' in mode online needs an API key: set WANDB_API_KEY (or "
                "WANDB_API_KEY_FILE), or use monitoring.wandb.mode: offline",
                field="spec.monitoring.wandb.mode",
            )
        options: dict[str, Any] = {"console": "off", "silent": True, "x_disable_stats": True}
        if key and settings.mode == "online":
            options["api_key"] = key
        self._run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            name=settings.name or run_name(run_dir),
            group=run_name(run_dir),
            tags=list(settings.tags),
            dir=str(root),
            mode=settings.mode,
            config=spec.to_document(),
            settings=wandb.Settings(**options),
            reinit="create_new",
        )
        self.dir = Path(self._run.dir).parent

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """An MLflow run, through the client API (no global active run)."""

    name = "mlflow"

    def __init__(self, spec: RunSpec, run_dir: Path) -> None:
        settings = spec.monitoring.mlflow
        uri = settings.tracking_uri or (run_dir.resolve() / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses file stores unless told they are wanted; the user's value wins.
            envs.set_default("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(settings.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(settings.experiment)
        )
        run = self._client.create_run(
            experiment_id,
            run_name=settings.run_name or run_name(run_dir),
            tags={"aflowrl.run": run_name(run_dir), "aflowrl.run_dir": str(run_dir.resolve())},
        )
        self.run_id: str = run.info.run_id
        self._client.log_text(
            self.run_id, yaml.safe_dump(spec.to_document(), sort_keys=False), "spec.yaml"
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    """MLflow names allow letters, digits, ``_ - . / :`` and spaces: anything else is ``_``."""
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in key)


class Trackers:
    """Every open tracker; each call goes to all of them (module docstring)."""

    def __init__(self, trackers: Sequence[Tracker] = ()) -> None:
        self.trackers = list(trackers)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def log(self, step: int, record: Mapping[str, Any]) -> None:
        """Send a ``metrics.jsonl`` record's scalars to every tracker."""
        scalars = scalars_of(record)
        for tracker in list(self.trackers):
            try:
                tracker.log(step, scalars)
            except Exception:
                logger.exception("logger %r failed and is turned off for this run", tracker.name)
                self.trackers.remove(tracker)
                self._close(tracker)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            self._close(tracker)

    @staticmethod
    def _close(tracker: Tracker) -> None:
        try:
            tracker.close()
        except Exception:
            logger.exception("logger %r failed to close", tracker.name)

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trackers(spec: RunSpec, run_dir: Path) -> Trackers:
    """Open the trackers of ``spec.monitoring.loggers`` (in that order) for ``run_dir``."""
    monitoring = spec.monitoring
    check_available(monitoring.loggers)
    opened = Trackers()
    try:
        for name in monitoring.loggers:
            opened.trackers.append(_open(name, spec, run_dir))
    except BaseException:
        opened.close()
        raise
    if opened.trackers:
        logger.info("experiment trackers: %s", ", ".join(opened.names))
    return opened


def _open(name: str, spec: RunSpec, run_dir: Path) -> Tracker:
    if name == "console":
        return ConsoleTracker()
    if name == "tensorboard":
        settings = spec.monitoring.tensorboard
        logdir = Path(settings.dir) if settings.dir else run_dir / "tensorboard"
        return TensorBoardTracker(logdir, flush_s=settings.flush_s)
    if name == "wandb":
        return WandbTracker(spec, run_dir)
    return MlflowTracker(spec, run_dir)
