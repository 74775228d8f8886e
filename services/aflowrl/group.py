"""A vLLM engine spanning the pods of a LeaderWorkerSet group (``rollout.nodesPerReplica`` > 1).

The operator runs each multi-node rollout replica as one group (``aflowrl_operator.groups``):
the leader pod (index 0) runs ``aflowrl serve rollout``, the others ``aflowrl serve
rollout-worker``, and every pod gets ``AFLOWRL_GROUP_LEADER`` / ``_SIZE`` / ``_RANK`` /
``_PORT`` (:class:`GroupTopology`). This module is what both sides share:

- :func:`engine_parallel_args`: the ``EngineArgs`` parallelism of an engine: tensor and
  pipeline parallel sizes and, across pods, vLLM's ``mp`` executor with ``nnodes`` /
  ``node_rank`` / ``master_addr`` / ``master_port`` (the leader is the torch.distributed
  master) or its ``ray`` executor;
- :func:`ray_head`: on the leader with ``distributedBackend: ray``, a Ray head on the group's
  port for the lifetime of the service (vLLM's Ray executor attaches to it through
  ``RAY_ADDRESS``); the other pods join it with ``ray start --address ... --block``;
- :func:`worker_command` and :func:`run_worker`: what a worker pod runs: vLLM's headless
  multiprocessing executor for this node's ranks (``mp``, as ``vllm serve --headless`` does it),
  or a Ray node joining the leader's head (``ray``).

Weight updates reach every rank of the group through the engine's ``collective_rpc``, which
spans the workers of every pod: the weight group of the nccl transport has tensor x pipeline
parallel ranks per replica (``RolloutSpec.engine_gpus``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aflowrl import envs
from aflowrl.config import RunSpec
from aflowrl.config.policy import LoraSpec
from aflowrl.config.rollout import VLLM_LORA_RANKS, VllmEngineSpec
from aflowrl.errors import FailedPreconditionError

logger = logging.getLogger(__name__)

RAY_START_TIMEOUT_S = 120.0
"""How long the leader waits for its Ray head to accept connections."""


@dataclasses.dataclass(frozen=True)
class GroupTopology:
    """This pod's place in its group."""

    leader: str
    """The leader pod's address (DNS name)."""
    size: int
    """Pods in the group."""
    rank: int
    """This pod's index; 0 is the leader."""
    port: int
    """The leader's port where the group meets (the mp master or the Ray head)."""

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> GroupTopology | None:
        """The topology the operator set (``AFLOWRL_GROUP_*``); None outside a group."""
        leader, port = envs.AFLOWRL_GROUP_LEADER, envs.AFLOWRL_GROUP_PORT
        if leader is None or port is None:
            return None
        size, rank = envs.AFLOWRL_GROUP_SIZE, envs.AFLOWRL_GROUP_RANK
        if not 0 <= rank < size:
            raise FailedPreconditionError(
                f"AFLOWRL_GROUP_RANK={rank} is not an index of a group of "
                f"AFLOWRL_GROUP_SIZE={size} pods"
            )
        return cls(leader=leader, size=size, rank=rank, port=port)


def engine_parallel_args(engine: VllmEngineSpec, topology: GroupTopology | None) -> dict[str, Any]:
    """``EngineArgs`` keyword arguments for the engine's parallelism on this pod (module
    docstring). One pod and one GPU: vLLM's in-process ``uni`` executor."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    args: dict[str, Any] = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp}
    if topology is None or topology.size == 1:
        args["distributed_executor_backend"] = "uni" if tp * pp == 1 else engine.distributed_backend
        return args
    args["distributed_executor_backend"] = engine.distributed_backend
    if engine.distributed_backend == "mp":
        args.update(
            nnodes=topology.size,
            node_rank=topology.rank,
            master_addr=topology.leader,
            master_port=topology.port,
        )
    return args


def _wait_for_port(host: str, port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise FailedPreconditionError(
                f"the Ray head exited with status {process.returncode} before serving on "
                f"port {port}"
            )
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
            return
        if time.monotonic() > deadline:
            raise FailedPreconditionError(f"the Ray head did not serve on port {port} in time")
        time.sleep(0.5)


def ray_command() -> str:
    """The ``ray`` executable of this Python environment, else of ``PATH`` (the ``ray`` extra of
    aflow-rl; the GPU image has it)."""
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if found is None:
        raise FailedPreconditionError(
            "vllm.distributedBackend ray needs Ray: pip install 'aflow-rl[ray]' (the GPU image "
            "has it), or use distributedBackend mp"
        )
    return found


@contextlib.contextmanager
def ray_head(port: int, *, timeout: float = RAY_START_TIMEOUT_S) -> Iterator[str]:
    """A Ray head on ``port`` for the duration of the block; yields its address and sets
    ``RAY_ADDRESS`` for this process, so vLLM's Ray executor attaches to it. The head runs in
    the foreground of a child process (``--block``) and is stopped on exit."""
    command = [ray_command(), "start", "--head", "--port", str(port)]
    command += ["--include-dashboard", "false", "--disable-usage-stats", "--block"]
    logger.info("starting the group's Ray head: %s", " ".join(command))
    process = subprocess.Popen(command, env=envs.child_environment(), start_new_session=True)
    try:
        _wait_for_port("127.0.0.1", port, process, timeout)
        address = f"127.0.0.1:{port}"
        with envs.overridden("RAY_ADDRESS", address):  # vLLM's Ray executor attaches to it
            yield address
    finally:
        stop_process_group(process)


def stop_process_group(process: subprocess.Popen[bytes], *, grace_s: float = 30.0) -> None:
    """Stop a process started with ``start_new_session`` and everything it started (a Ray
    node's GCS, raylet and workers share its process group): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        break


def worker_command(spec: RunSpec, topology: GroupTopology) -> list[str] | None:
    """The command a worker pod execs, or None when it runs vLLM's headless executor in
    this process (``mp``: :func:`run_worker`)."""
    if spec.rollout.vllm.distributed_backend == "ray":
        address = f"{topology.leader}:{topology.port}"
        return [ray_command(), "start", "--address", address, "--disable-usage-stats", "--block"]
    return None


def check_worker(spec: RunSpec, topology: GroupTopology | None) -> GroupTopology:
    """The topology of a worker pod, or why this is not one."""
    if spec.rollout.engine != "vllm" or spec.rollout.nodes_per_replica == 1:
        raise FailedPreconditionError(
            "aflowrl serve rollout-worker runs the other pods of a multi-node vLLM replica "
            f"(rollout.engine=vllm, rollout.nodesPerReplica > 1); this spec has "
            f"engine={spec.rollout.engine}, nodesPerReplica={spec.rollout.nodes_per_replica}"
        )
    if topology is None:
        raise FailedPreconditionError(
            "aflowrl serve rollout-worker needs AFLOWRL_GROUP_LEADER and AFLOWRL_GROUP_PORT "
            "(set by the operator in a LeaderWorkerSet group)"
        )
    if topology.is_leader:
        raise FailedPreconditionError(
            "AFLOWRL_GROUP_RANK=0 is the group's leader: it runs aflowrl serve rollout"
        )
    if topology.size != spec.rollout.nodes_per_replica:
        raise FailedPreconditionError(
            f"AFLOWRL_GROUP_SIZE={topology.size} differs from "
            f"rollout.nodesPerReplica={spec.rollout.nodes_per_replica}"
        )
    return topology


def vllm_lora_rank(rank: int) -> int:
    """The ``max_lora_rank`` to start vLLM with for adapters of ``rank``: vLLM takes only the
    values of :data:`VLLM_LORA_RANKS` (rank 4 is refused at start), and serves any adapter of a
    rank up to it. The run spec refuses ranks above the largest."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above {VLLM_LORA_RANKS[-1]}, vLLM's largest")


def engine_args(
    engine: VllmEngineSpec,
    model_dir: str,
    *,
    dtype: str,
    trust_remote_code: bool,
    lora: LoraSpec | None,
    cuda: bool,
    seed: int = 0,
) -> dict[str, Any]:
    """The ``EngineArgs`` of the policy's engine, but its parallelism
    (:func:`engine_parallel_args`): the leader's engine
    (:class:`aflowrl.rollout.vllm_engine.VllmEngine`) and every worker pod's ranks
    (:func:`run_worker`) take it from here, since a worker's configuration must equal its
    leader's (model, dtype, lengths, memory, LoRA, and the worker extension the weight updates
    call on every rank, and the weight-transfer backend)."""
    from aflowrl.rollout import vllm_worker

    args: dict[str, Any] = {
        "model": model_dir,
        "dtype": dtype if dtype != "auto" else ("bfloat16" if cuda else "float32"),
        "seed": seed,
        "max_model_len": engine.max_model_len,
        "enforce_eager": engine.enforce_eager or not cuda,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "trust_remote_code": trust_remote_code,
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": True,
        "worker_extension_cls": vllm_worker.EXTENSION,
        # The nccl transport's receiving end: vLLM's weight-transfer engine, backend "aflowrl".
        "weight_transfer_config": dict(vllm_worker.TRANSFER_CONFIG),
    }
    if lora is not None:
        args.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora.rank), max_loras=1)
    return args


def run_worker(spec: RunSpec, model_dir: str, topology: GroupTopology) -> None:
    """Serve this pod's ranks of the leader's engine until the leader goes (``mp``): vLLM's
    headless multiprocessing executor (what ``vllm serve --headless`` runs on a node of rank
    above 0), configured like the leader's engine (:func:`engine_args`)."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    policy = spec.policy
    kwargs = engine_args(
        spec.rollout.vllm,
        model_dir,
        dtype=policy.dtype,
        trust_remote_code=policy.trust_remote_code,
        lora=policy.lora,
        cuda=torch.cuda.is_available(),
    )
    args = EngineArgs(**kwargs, **engine_parallel_args(spec.rollout.vllm, topology))
    config = args.create_engine_config(headless=True)
    logger.info(
        "rollout worker %d of %d joining %s:%d",
        topology.rank,
        topology.size,
        topology.leader,
        topology.port,
    )
    executor = MultiprocExecutor(config, monitor_workers=False)
    executor.start_worker_monitor(inline=True)
