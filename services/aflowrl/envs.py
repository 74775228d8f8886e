"""Environment variables of aflow-rl: the one module that reads ``os.environ``.

Read a variable as an attribute (``from aflowrl import envs; envs.AFLOWRL_DATA_DIR``); each read
looks at the environment again, so tests can monkeypatch it. Pods get these from the operator;
local runs from the shell.

| variable | meaning |
|---|---|
| AFLOWRL_LOG_LEVEL | least severe level logged (DEBUG, INFO, WARNING, ERROR); default INFO |
| AFLOWRL_LOG_FORMAT | "text" or "json" log lines; default text |
| AFLOWRL_DATA_DIR | directory of the benchmark split files (``<benchmark>_<split>.jsonl``) |
| AFLOWRL_CACHE_DIR | cache of built models and evaluation results; default ~/.cache/aflowrl |
| AFLOWRL_DATA_URL | archive ``aflowrl data download`` fetches (a mirror); default AFlow's |
| AFLOWRL_EXECUTOR_API_KEY | API key of the executor endpoint (else OPENAI_API_KEY) |
| AFLOWRL_EXECUTOR_API_KEY_FILE | file holding that key (a mounted Secret); wins over the variable |
| AFLOWRL_EXECUTOR_BASE_URL | endpoint of the executor the run serves itself (spec executor.serve) |
| AFLOWRL_AUTH_TOKEN_FILE | file holding the bearer token gRPC calls carry (a mounted Secret) |
| AFLOWRL_TLS_DIR | directory with tls.crt, tls.key and ca.crt: gRPC TLS is on when set |
| AFLOWRL_TLS_CLIENT_DIR | certificate clients present with grpc.mtls; default AFLOWRL_TLS_DIR |
| AFLOWRL_SPEC_FILE | path of the resolved RunSpec (the run's ConfigMap, mounted in pods) |
| AFLOWRL_RUN_NAME / AFLOWRL_RUN_NAMESPACE | the TrainingRun a trainer pod reports status to |
| AFLOWRL_POD_NAME | the pod's name (downward API); default: the host name |
| KUBERNETES_SERVICE_HOST / _PORT | the API server (set by Kubernetes in every pod) |
| AFLOWRL_SANDBOX | sandbox isolation: "auto" (bubblewrap where it runs), "bwrap" or "rlimits" |
| WANDB_API_KEY | Weights & Biases API key (logger ``wandb``, mode online); never logged |
| WANDB_API_KEY_FILE | file holding that key (a mounted Secret); wins over the variable |
| MLFLOW_ALLOW_FILE_STORE | MLflow file stores allowed: the mlflow logger sets "true" if unset |
| MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ | glibc's malloc settings: when set, kept |
| GLIBC_TUNABLES | with a ``glibc.malloc.`` setting, malloc is left alone (``GLIBC_MALLOC_SET``) |
| RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT | set by torchrun for learner ranks |
| LOCAL_WORLD_SIZE | ranks per node (torchrun): fewer than WORLD_SIZE makes the mesh HSDP |
| AFLOWRL_RDMA_DEVICES | RDMA devices the pod asked for (resources.rdma): serve checks they exist |
| AFLOWRL_GROUP_LEADER | a pod of a multi-node group (LeaderWorkerSet): the leader's address |
| AFLOWRL_GROUP_SIZE / _RANK | pods of the group; this pod's index in it (0: the leader) |
| AFLOWRL_GROUP_PORT | the leader's port where the group's engine meets (mp master or Ray) |

Third-party libraries that read their own variables at import (vLLM) get defaults through
:func:`set_default`, so a value the operator or the user set always wins.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    AFLOWRL_LOG_LEVEL: str
    AFLOWRL_LOG_FORMAT: str
    AFLOWRL_DATA_DIR: str | None
    AFLOWRL_CACHE_DIR: Path
    AFLOWRL_DATA_URL: str | None
    AFLOWRL_EXECUTOR_API_KEY: str | None
    AFLOWRL_EXECUTOR_BASE_URL: str | None
    AFLOWRL_AUTH_TOKEN: str | None
    AFLOWRL_TLS_DIR: str | None
    AFLOWRL_TLS_CLIENT_DIR: str | None
    AFLOWRL_SPEC_FILE: str | None
    AFLOWRL_RUN_NAME: str | None
    AFLOWRL_RUN_NAMESPACE: str | None
    AFLOWRL_POD_NAME: str
    KUBERNETES_SERVICE_HOST: str | None
    KUBERNETES_SERVICE_PORT: int
    AFLOWRL_SANDBOX: str
    WANDB_API_KEY: str | None
    GLIBC_MALLOC_SET: bool
    RANK: int
    LOCAL_RANK: int
    WORLD_SIZE: int
    LOCAL_WORLD_SIZE: int
    AFLOWRL_RDMA_DEVICES: int
    AFLOWRL_GROUP_LEADER: str | None
    AFLOWRL_GROUP_SIZE: int
    AFLOWRL_GROUP_RANK: int
    AFLOWRL_GROUP_PORT: int | None
    MASTER_ADDR: str | None
    MASTER_PORT: int | None


def _read_secret(file_var: str, value_vars: tuple[str, ...]) -> str | None:
    path = os.environ.get(file_var)
    if path:
        return Path(path).read_text().strip() or None
    for name in value_vars:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


environment_variables: dict[str, Callable[[], Any]] = {
    "AFLOWRL_LOG_LEVEL": lambda: os.environ.get("AFLOWRL_LOG_LEVEL", "INFO").upper(),
    "AFLOWRL_LOG_FORMAT": lambda: os.environ.get("AFLOWRL_LOG_FORMAT", "text").lower(),
    "AFLOWRL_DATA_DIR": lambda: os.environ.get("AFLOWRL_DATA_DIR") or None,
    "AFLOWRL_CACHE_DIR": lambda: Path(
        os.environ.get("AFLOWRL_CACHE_DIR") or Path.home() / ".cache" / "aflowrl"
    ),
    "AFLOWRL_DATA_URL": lambda: os.environ.get("AFLOWRL_DATA_URL") or None,
    "AFLOWRL_EXECUTOR_API_KEY": lambda: _read_secret(
        "AFLOWRL_EXECUTOR_API_KEY_FILE", ("AFLOWRL_EXECUTOR_API_KEY", "OPENAI_API_KEY")
    ),
    "AFLOWRL_EXECUTOR_BASE_URL": lambda: os.environ.get("AFLOWRL_EXECUTOR_BASE_URL") or None,
    "AFLOWRL_AUTH_TOKEN": lambda: _read_secret("AFLOWRL_AUTH_TOKEN_FILE", ()),
    "AFLOWRL_TLS_DIR": lambda: os.environ.get("AFLOWRL_TLS_DIR") or None,
    "AFLOWRL_TLS_CLIENT_DIR": lambda: os.environ.get("AFLOWRL_TLS_CLIENT_DIR") or None,
    "AFLOWRL_SPEC_FILE": lambda: os.environ.get("AFLOWRL_SPEC_FILE") or None,
    "AFLOWRL_RUN_NAME": lambda: os.environ.get("AFLOWRL_RUN_NAME") or None,
    "AFLOWRL_RUN_NAMESPACE": lambda: os.environ.get("AFLOWRL_RUN_NAMESPACE") or None,
    "AFLOWRL_POD_NAME": lambda: os.environ.get("AFLOWRL_POD_NAME") or socket.gethostname(),
    "KUBERNETES_SERVICE_HOST": lambda: os.environ.get("KUBERNETES_SERVICE_HOST") or None,
    "KUBERNETES_SERVICE_PORT": lambda: _int("KUBERNETES_SERVICE_PORT", 443),
    "AFLOWRL_SANDBOX": lambda: os.environ.get("AFLOWRL_SANDBOX", "auto").lower(),
    "WANDB_API_KEY": lambda: _read_secret("WANDB_API_KEY_FILE", ("WANDB_API_KEY",)),
    "GLIBC_MALLOC_SET": lambda: bool(
        os.environ.get("MALLOC_MMAP_THRESHOLD_")
        or os.environ.get("MALLOC_TRIM_THRESHOLD_")
        or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
    ),
    "RANK": lambda: _int("RANK", 0),
    "LOCAL_RANK": lambda: _int("LOCAL_RANK", 0),
    "WORLD_SIZE": lambda: _int("WORLD_SIZE", 1),
    "LOCAL_WORLD_SIZE": lambda: _int("LOCAL_WORLD_SIZE", _int("WORLD_SIZE", 1)),
    "AFLOWRL_RDMA_DEVICES": lambda: _int("AFLOWRL_RDMA_DEVICES", 0),
    "AFLOWRL_GROUP_LEADER": lambda: os.environ.get("AFLOWRL_GROUP_LEADER") or None,
    "AFLOWRL_GROUP_SIZE": lambda: _int("AFLOWRL_GROUP_SIZE", 1),
    "AFLOWRL_GROUP_RANK": lambda: _int("AFLOWRL_GROUP_RANK", 0),
    "AFLOWRL_GROUP_PORT": lambda: (
        int(os.environ["AFLOWRL_GROUP_PORT"]) if os.environ.get("AFLOWRL_GROUP_PORT") else None
    ),
    "MASTER_ADDR": lambda: os.environ.get("MASTER_ADDR") or None,
    "MASTER_PORT": lambda: (
        int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None
    ),
}


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables)


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of this process's environment for a child process, with ``extra`` set."""
    env = dict(os.environ)
    env.update(extra or {})
    return env


@contextlib.contextmanager
def overridden(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` for this process during the block, then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def set_default(name: str, value: str) -> str:
    """Set ``name`` for this process unless already set (third-party settings); returns it."""
    return os.environ.setdefault(name, value)


@contextlib.contextmanager
def scoped(name: str, value: str) -> Iterator[None]:
    """Set ``name`` to ``value`` for the duration of the block (a third-party setting read when
    an object is built, e.g. torch's NCCL error handling for one process group)."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
