"""Checks of a run's inputs before any work starts, each failure naming what to fix.

``aflowrl train`` validates the spec first (``RunSpec``: an unknown benchmark or a bad value is
reported as ``spec.environment.benchmarks[0]: ...``). Then, before a process is started, these
checks look at what the spec points to:

- the benchmarks' data: every served benchmark (``environment.benchmarks`` and
  ``heldOutBenchmarks``) without a packaged copy needs ``environment.data.dir`` (or
  ``$AFLOWRL_DATA_DIR``, or the default directory ``aflowrl data download`` fills) holding its
  split files; both splits of each are loaded, so a missing
  file or a malformed line is reported now rather than by an environment replica later;
- the executor: an ``openai`` endpoint must answer HTTP at ``baseUrl`` (any status will do: it
  proves something listens), take the API key, and serve ``model`` when it lists its models
  (``GET /models``); ``serve`` exists only on Kubernetes;
- the policy: a model directory must hold a ``config.json``; ``tiny`` is built on first use;
- the experiment trackers: each of ``monitoring.loggers`` has its library installed
  (:func:`aflowrl.trainer.tracking.check_available`; the error names the extra);
- gRPC TLS: ``grpc.tlsSecret`` is a Kubernetes Secret, so a local run takes the directory of
  ``AFLOWRL_TLS_DIR`` instead, and its certificate files must load (``grpc.mtls`` needs TLS).

Used by :mod:`aflowrl.cli.train` for local runs (a cluster's pods check their own inputs).
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

from aflowrl import envs
from aflowrl.common import tls
from aflowrl.config import BUILT_IN_MODELS, OpenAIExecutorSpec, RunSpec
from aflowrl.errors import AflowRLError, InvalidInputError
from aflowrl.local.errors import PreflightError

logger = logging.getLogger(__name__)


def check_data(spec: RunSpec) -> None:
    """Both splits of every served benchmark load (module docstring)."""
    from aflowrl.benchmarks import get_benchmark, resolve_data_dir

    resolved = resolve_data_dir(spec.environment.data.dir)
    data = str(resolved) if resolved is not None else None
    field = "spec.environment.data.dir"
    needing = spec.environment.needing_data_dir
    if needing:
        if not data:
            files = ", ".join(f"{name}_validate.jsonl, {name}_test.jsonl" for name in needing)
            raise PreflightError(
                f"{', '.join(needing)} has no packaged copy: set it to a directory of AFlow's "
                f"split files ({files}), or set AFLOWRL_DATA_DIR, or run 'aflowrl data download'",
                field=field,
            )
        if not Path(data).expanduser().is_dir():
            raise PreflightError(f"{data} is not a directory", field=field)
    for name in spec.environment.served_benchmarks:
        benchmark = get_benchmark(name)
        for split in ("validate", "test"):
            try:
                problems = benchmark.load(split, data)
            except AflowRLError as exc:
                raise PreflightError(str(exc), field=field) from None
            if not problems:
                raise PreflightError(f"the {split} split of {name} is empty", field=field)


def check_executor(spec: RunSpec, *, timeout_s: float = 5.0) -> None:
    """An ``openai`` executor's endpoint answers (module docstring)."""
    executor = spec.environment.executor
    if not isinstance(executor, OpenAIExecutorSpec):
        return
    field = "spec.environment.executor.baseUrl"
    if executor.base_url is None:
        raise PreflightError(
            "executor.serve is served by the operator on Kubernetes; locally, point baseUrl at "
            "a running OpenAI-compatible server",
            field=field,
        )
    url = executor.base_url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            reply.read(1)
    except urllib.error.HTTPError:
        return  # it answered (401, 404...): something listens there
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PreflightError(f"cannot reach {executor.base_url}: {reason}", field=field) from None
    _check_served_model(executor.base_url, executor.model, timeout_s=timeout_s)


def _check_served_model(base_url: str, model: str, *, timeout_s: float) -> None:
    """The endpoint takes the API key and, when it lists its models, serves ``model``."""
    import asyncio

    from aflowrl.executor.errors import ExecutorError, ExecutorRequestError
    from aflowrl.executor.preflight import served_models

    try:
        models = asyncio.run(served_models(base_url, timeout_s=timeout_s))
    except ExecutorRequestError as exc:  # 401/403: the key
        raise PreflightError(str(exc), field="AFLOWRL_EXECUTOR_API_KEY") from None
    except ExecutorError:
        return  # it answered, if not well: the run's own retries and errors take over
    if models and model not in models:
        raise PreflightError(
            f"{base_url} does not serve {model!r} (it serves {', '.join(models[:10])})",
            field="spec.environment.executor.model",
        )


def check_policy(spec: RunSpec) -> None:
    """The policy model directory exists (a built-in model is built on first use)."""
    model = spec.policy.model
    if model in BUILT_IN_MODELS:
        return
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise PreflightError(
            f"{model} is not a model directory (no config.json); nothing is downloaded",
            field="spec.policy.model",
        )


def check_tls(spec: RunSpec) -> None:
    """TLS asked for has its certificates here (module docstring)."""
    if spec.grpc.tls_secret is not None and envs.AFLOWRL_TLS_DIR is None:
        raise PreflightError(
            f"{spec.grpc.tls_secret!r} is a Kubernetes Secret, which a local run cannot mount: "
            "set AFLOWRL_TLS_DIR to a directory holding its tls.crt, tls.key and ca.crt",
            field="spec.grpc.tlsSecret",
        )
    try:
        tls.server_tls_from_spec(spec.grpc)
        tls.client_tls_from_spec(spec.grpc)
    except InvalidInputError as exc:
        field = exc.field or "grpc"
        if field.startswith("grpc"):  # a spec field, else the variable naming the directory
            field = f"spec.{field}"
        raise PreflightError(exc.reason, field=field) from None


def check_local_run(spec: RunSpec) -> None:
    """Every check of the module docstring, cheapest first."""
    from aflowrl.trainer import tracking

    tracking.check_available(spec.monitoring.loggers)
    check_tls(spec)
    check_policy(spec)
    check_executor(spec)
    check_data(spec)
