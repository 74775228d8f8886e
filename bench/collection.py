"""The same episodes collected free-running and in lockstep rounds: wall time and equality.

An environment replica runs in this process (the embedded default's environment, surrogate
executor, one replica) and a uniform actor decides, so no model is involved. Each iteration is
collected twice through :meth:`aflowrl.trainer.collect.Collector.collect`: free-running (every
episode steps as soon as its decision is made) and with Steps held until every live episode has
one waiting, then released together (the lockstep rounds of earlier versions). Since nothing
collected depends on the order in which steps return, both give the same rewards and executor
calls; the bench prints their wall times.

    python bench/collection.py [--iterations 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from aflowrl import presets
from aflowrl.config import RunSpec
from aflowrl.envsvc.server import running_server
from aflowrl.trainer.acting import UniformActor
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.collect import Collector, seed_workflows
from aflowrl.trainer.values import ValueTable


class Lockstep:
    """An environment client whose Steps wait until every live episode has one waiting."""

    def __init__(self, env: EnvironmentClient, episodes: int) -> None:
        self.env = env
        self.live = episodes
        self.waiting: list[asyncio.Future[None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def _release(self) -> None:
        if self.waiting and len(self.waiting) >= self.live:
            waiting, self.waiting = self.waiting, []
            for future in waiting:
                future.set_result(None)

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self._release()
        await future
        reply = await self.env.step(*args, **kwargs)
        if reply[0].done:
            self.live -= 1
            self._release()
        return reply


async def collect_all(spec: RunSpec, mode: str, iterations: int) -> None:
    """Every iteration in ``mode``, on a fresh replica (so neither mode finds the other's
    evaluations cached)."""
    episodes = spec.trainer.tasks_per_iteration * spec.trainer.group_size
    async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server:
        env = EnvironmentClient([f"127.0.0.1:{server.port}"])
        try:
            for iteration in range(iterations):
                client: Any = Lockstep(env, episodes) if mode == "lockstep" else env
                collector = Collector(
                    spec,
                    client,
                    UniformActor(),
                    seed_workflows(spec.environment.training_benchmarks),
                    values=ValueTable("policy"),
                )
                started = time.perf_counter()
                rows = (await collector.collect(iteration, Timeline())).rows
                seconds = time.perf_counter() - started
                calls = sum(r.executor_calls for r in rows)
                total = sum(r.reward for r in rows)
                print(f"{iteration:<10}{mode:<10}{seconds:>8.2f}{calls:>7}{total:>9.3f}")
        finally:
            await env.close()


async def main(iterations: int) -> None:
    doc = presets.load().to_document()
    doc["environment"]["replicas"] = {"min": 1, "max": 1}
    spec = RunSpec.from_document(doc)
    print(f"{'iteration':<10}{'mode':<10}{'seconds':>8}{'calls':>7}{'return':>9}")
    for mode in ("lockstep", "free"):
        await collect_all(spec, mode, iterations)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    asyncio.run(main(parser.parse_args().iterations))
