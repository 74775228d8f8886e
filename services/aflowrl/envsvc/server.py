"""Entry point of ``aflowrl serve env``: check the spec, warm up, serve the environment.

Called by :mod:`aflowrl.cli.serve` after the spec is validated. Before the port is bound,
:func:`check_spec` refuses what cannot work (a benchmark that needs a data directory without
one, a directory that does not exist, an executor with no endpoint or not installed). Then the
server starts with health NOT_SERVING and warms up (:func:`open_environment`): it loads the
splits of every served benchmark (``environment.benchmarks`` and ``heldOutBenchmarks``),
builds one executor for all of them (waiting for an OpenAI-compatible endpoint to answer),
opens the evaluation cache (SQLite when ``environment.evaluation.cachePath``) and starts the
sandbox pool (a sandbox that cannot start ends the process with one line saying why); only then
does health turn SERVING. A failure of any of these ends the process
with a message naming the problem. SIGTERM: NOT_SERVING, in-flight calls get
``grpc.shutdownGraceS`` to finish, then the executor and the cache are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aflowrl import envs, sandbox
from aflowrl._proto.v1 import environment_pb2_grpc
from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.base import SPLITS, Benchmark, Problem
from aflowrl.benchmarks.errors import DataNotFoundError
from aflowrl.common.server import MIB, GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.config import RunSpec
from aflowrl.config.environment import EnvironmentSpec
from aflowrl.envsvc import executors
from aflowrl.envsvc.blob import MAX_BLOB_BYTES, StateCodec
from aflowrl.envsvc.environment import Environment, ServedBenchmark
from aflowrl.envsvc.errors import SandboxStartError
from aflowrl.envsvc.metrics import EnvironmentMetrics
from aflowrl.envsvc.service import SERVICE_NAME, EnvironmentServicer
from aflowrl.errors import InvalidInputError
from aflowrl.workflow import EvaluationCache

logger = logging.getLogger(__name__)


def data_dir(spec: EnvironmentSpec) -> str | None:
    """``environment.data.dir``, else $AFLOWRL_DATA_DIR, else None."""
    return spec.data.dir or envs.AFLOWRL_DATA_DIR


def check_spec(spec: RunSpec) -> None:
    """Refuse, before anything is loaded or bound, a spec this replica cannot serve."""
    env = spec.environment
    if env.search.selection == "fused" and env.search.value_source == "none":
        raise InvalidInputError(
            "fused selection needs a value source ('anchor-mc' or 'critic'; the trainer sends "
            "the values with each call)",
            field="environment.search.valueSource",
        )
    directory = data_dir(env)
    if directory is None and env.needing_data_dir:
        needing = env.needing_data_dir
        raise InvalidInputError(
            f"{', '.join(needing)} needs a data directory with "
            f"{', '.join(f'{name}_<split>.jsonl' for name in needing)} files: "
            "set environment.data.dir (or AFLOWRL_DATA_DIR)",
            field="environment.data.dir",
        )
    if directory is not None and not Path(directory).is_dir():
        raise InvalidInputError(
            f"{directory} does not exist or is no directory", field="environment.data.dir"
        )
    executors.check_executor(env)


async def start_sandbox() -> sandbox.SandboxPool:
    """The process's sandbox pool, started; a sandbox that cannot start stops the replica with
    the reason (SandboxStartError), not with a traceback."""
    try:
        return await asyncio.to_thread(sandbox.default_pool)
    except sandbox.SandboxUnavailableError as exc:
        raise SandboxStartError(f"the code sandbox cannot start: {exc}") from None


def scoring_benchmark(name: str, metrics: EnvironmentMetrics) -> Benchmark:
    """The benchmark; a code benchmark's hidden-test runs are counted in ``sandbox_runs_total``.

    (The evaluator counts the workflow operators' own sandbox runs from their traces.)
    """
    shared = get_benchmark(name)
    if shared.task_type != "code":
        return shared

    async def run(
        code: str, *, stdin: str, timeout_s: float, memory_mb: int, private_main: bool
    ) -> sandbox.SandboxResult:
        result = await sandbox.arun_python(
            code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb, private_main=private_main
        )
        metrics.sandbox_runs.labels(result.status).inc()
        return result

    factory: Any = type(shared)  # CodeBenchmark subclasses take the runner
    built: Benchmark = factory(runner=run)
    return built


def load_splits(spec: EnvironmentSpec, name: str) -> dict[str, list[Problem]]:
    """Every split of benchmark ``name`` that can be loaded; the search's split must be."""
    benchmark = get_benchmark(name)
    splits: dict[str, list[Problem]] = {}
    for split in SPLITS:
        try:
            splits[split] = benchmark.load(split, data_dir(spec))
        except DataNotFoundError as exc:
            if split == spec.evaluation.split:
                raise
            logger.warning("%s has no %s split here (%s): Evaluate on it fails", name, split, exc)
    return splits


@contextlib.asynccontextmanager
async def open_environment(
    spec: RunSpec, metrics: EnvironmentMetrics
) -> AsyncIterator[Environment]:
    """Warm up: load the data, build the executor, open the cache, start the sandbox pool."""
    env = spec.environment
    loaded = {
        name: await asyncio.to_thread(load_splits, env, name) for name in env.served_benchmarks
    }
    problems = [p for splits in loaded.values() for split in splits.values() for p in split]
    executor = await asyncio.to_thread(executors.build_executor, env, problems, data_dir(env))
    try:
        if env.executor.type == "openai":
            await executors.probe_openai(env.executor)
        pool = await start_sandbox()
        with EvaluationCache(env.evaluation.cache_path) as cache:
            codec = StateCodec(
                envs.AFLOWRL_AUTH_TOKEN,
                max_bytes=min(MAX_BLOB_BYTES, spec.grpc.max_message_mib * MIB // 2),
            )
            environment = Environment(
                env,
                benchmarks=[
                    ServedBenchmark(scoring_benchmark(name, metrics), splits)
                    for name, splits in loaded.items()
                ],
                executor=executors.MeteredExecutor(executor, metrics),
                cache=cache,
                metrics=metrics,
                codec=codec,
            )
            held_out = set(env.held_out_benchmarks)
            for name, splits in loaded.items():
                logger.info(
                    "environment serves %s%s: %s (episodes score on %s of %d %s problems)",
                    name,
                    " (held out: never trained on)" if name in held_out else "",
                    ", ".join(f"{split} {len(p)}" for split, p in splits.items()),
                    env.evaluation.max_problems or "all",
                    len(splits[env.evaluation.split]),
                    env.evaluation.split,
                )
            logger.info(
                "environment: %d repeat(s) per problem; executor %s; cache %s; sandbox %s; "
                "state blobs %s",
                env.evaluation.repeats,
                executor.executor_id,
                env.evaluation.cache_path or "in memory",
                pool.mode,
                "signed" if codec.signed else "checksummed (no auth token: not signed)",
            )
            yield environment
    finally:
        await executor.aclose()


@contextlib.asynccontextmanager
async def running_server(
    spec: RunSpec,
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    health_port: int | None = None,
    handle_signals: bool = False,
) -> AsyncIterator[GrpcServer]:
    """The environment service, SERVING once warm; everything closed on the way out.

    ``handle_signals``: SIGTERM and SIGINT stop it gracefully from before it serves (what
    ``aflowrl serve env`` wants; not a server embedded in another program)."""
    check_spec(spec)
    metrics = EnvironmentMetrics(benchmarks=spec.environment.served_benchmarks)
    servicer = EnvironmentServicer()
    async with contextlib.AsyncExitStack() as stack:

        async def warmup() -> None:
            servicer.attach(await stack.enter_async_context(open_environment(spec, metrics)))

        options = ServerOptions.from_spec(
            "environment",
            spec.grpc,
            port=port,
            metrics_port=metrics_port,
            host=host,
            health_port=health_port,
        )
        registration = ServiceRegistration(
            servicer, environment_pb2_grpc.add_EnvironmentServiceServicer_to_server, SERVICE_NAME
        )
        server = GrpcServer(options, [registration], warmup=warmup, metrics=metrics)
        servicer.uptime = lambda: server.uptime_s
        if handle_signals:
            server.handle_signals()  # before it serves: a SIGTERM is never lost
        async with server:
            yield server


async def serve(
    spec: RunSpec,
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    health_port: int | None = None,
) -> None:
    """Serve until SIGTERM / SIGINT (what ``aflowrl serve env`` runs)."""
    async with running_server(
        spec,
        host=host,
        port=port,
        metrics_port=metrics_port,
        health_port=health_port,
        handle_signals=True,
    ) as server:
        await server.serve_until_signal()
