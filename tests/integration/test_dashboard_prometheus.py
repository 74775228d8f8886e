"""Every query of the Grafana dashboard returns data from a real Prometheus scraping a local run.

Debian's ``prometheus`` (installed by ``make monitoring-tools``) scrapes, every second, the
``/metrics`` of each service of a short local training and of its trainer: the endpoints a
PodMonitor scrapes in a cluster, with the labels it adds there (``namespace``, ``pod``,
``aflowrl_io_run``, ``app_kubernetes_io_component``...). After the run, each panel query, with
the dashboard's template variables substituted, is evaluated through Prometheus's HTTP API at the
last moment every target was up: each must return series carrying the labels its legend shows,
and a number. The rate windows are the dashboard's own; one-second scrapes give them samples
enough within a run of a minute or two.

Skipped, saying why, only where no ``prometheus`` binary is installed.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from aflowrl.config import RunSpec
from aflowrl.local.launcher import LocalTargets, local_spec
from aflowrl.local.processes import ProcessGroup, free_ports
from aflowrl.local.run import run_local
from dashboard import Query, load, panel_queries, variable_queries

pytestmark = pytest.mark.slow

NAMESPACE = "aflowrl-test"
RUN = "dash-run"
VARIABLES = {"$namespace": NAMESPACE, "$run": RUN}

SPEC = """
policy: {model: tiny, dtype: float32}
learner:
  fsdp: {mixedPrecision: none}
  loss: {miniBatchSize: 2, microBatchSize: 2, klCoef: 0.0}
environment:
  benchmarks: [humaneval]
  executor: {type: surrogate}
  replicas: {min: 2, max: 2}
  evaluation: {maxProblems: 2, repeats: 1}
  search: {maxSteps: 1, maxAdmissibleActions: 4, maxObservationChars: 800}
trainer: {iterations: 3, tasksPerIteration: 1, groupSize: 2, checkpointEvery: 1,
          finalTestEval: false}
"""
"""Three short iterations: every phase, service call and weight push happens more than once."""

COMPONENTS = {"env": "environment", "rollout": "rollout", "learner": "learner"}


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip(
            "no prometheus binary: `make monitoring-tools` installs Debian's package where it "
            "runs as root with apt"
        )
    return found


def _target_groups(targets: dict[str, str]) -> list[dict]:
    """file_sd groups: one per pod, labelled as a PodMonitor labels a run's pods."""
    groups = []
    for name, address in targets.items():
        component = COMPONENTS.get(name.split("-")[0], name)
        groups.append(
            {
                "targets": [address],
                "labels": {
                    "namespace": NAMESPACE,
                    "pod": f"{RUN}-{name}",
                    "container": component,
                    "endpoint": "metrics",
                    "aflowrl_io_run": RUN,
                    "app_kubernetes_io_component": component,
                },
            }
        )
    return groups


def _write_targets(path: Path, targets: dict[str, str]) -> None:
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(_target_groups(targets)))
    staged.replace(path)  # Prometheus watches the file: a rename is one complete update


class _Prometheus:
    """A Prometheus process scraping the targets of ``targets.json`` every second."""

    def __init__(self, binary: str, root: Path) -> None:
        self.root = root
        self.targets = root / "targets.json"
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        _write_targets(self.targets, {})
        config = root / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: aflowrl-test/dash-run\n"
            f"    file_sd_configs: [{{files: ['{self.targets}'], refresh_interval: 1s}}]\n"
        )
        self.log = (root / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )

    async def ready(self, session: aiohttp.ClientSession, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.root / "prometheus.log").read_text()
            try:
                async with session.get(f"{self.url}/-/ready") as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout_s}s")

    async def query(self, session: aiohttp.ClientSession, expr: str, at: float) -> list[dict]:
        params = {"query": expr, "time": f"{at:.3f}"}
        async with session.get(f"{self.url}/api/v1/query", params=params) as reply:
            body = await reply.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict] = body["data"]["result"]
        return result

    async def last_time_all_up(self, session: aiohttp.ClientSession, start: float) -> float:
        """The last second at which every target's latest scrape had succeeded.

        A scrape that fails (a busy learner answering after the 1 s timeout) makes that
        target's series stale until the next success: queries at such a moment see none.
        """
        params = {"query": "up", "start": f"{start:.0f}", "end": f"{time.time():.0f}", "step": "1"}
        async with session.get(f"{self.url}/api/v1/query_range", params=params) as reply:
            body = await reply.json()
        series = body["data"]["result"]
        assert len(series) == len(COMPONENTS) + 2, series  # two env replicas and the trainer
        up = [{float(t) for t, v in s["values"] if v == "1"} for s in series]
        common = set.intersection(*up)
        assert common, f"no moment with every target up: {[s['metric']['pod'] for s in series]}"
        return max(common)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


def _substitute(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def _problems(query: Query, result: list[dict]) -> list[str]:
    if not result:
        return [f"{query.where}: no series for {query.expr}"]
    found = []
    for label in query.legend_labels:
        missing = [r["metric"] for r in result if not r["metric"].get(label)]
        if missing:
            found.append(f"{query.where}: series without {label!r}: {missing[:2]}")
    values = [float(r["value"][1]) for r in result]
    if not any(math.isfinite(v) for v in values):
        found.append(f"{query.where}: only {values[:3]} for {query.expr}")
    return found


async def test_every_dashboard_query_returns_series_from_a_local_run(tmp_path):
    binary = _prometheus_binary()
    prometheus = _Prometheus(binary, tmp_path)
    trainer_port = free_ports(1)[0]
    spec = local_spec(RunSpec.from_yaml(SPEC), tmp_path / "run")
    scraped: dict[str, str] = {}

    def on_started(targets: LocalTargets, _group: ProcessGroup) -> None:
        scraped.update(targets.metrics)
        scraped["trainer"] = f"127.0.0.1:{trainer_port}"
        _write_targets(prometheus.targets, scraped)

    try:
        async with aiohttp.ClientSession() as session:
            await prometheus.ready(session)
            started = time.time()
            await run_local(
                spec, tmp_path / "run", on_started=on_started, metrics_port=trainer_port
            )
            records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
            assert len(records) == 3
            at = await prometheus.last_time_all_up(session, started)
            dashboard = load()
            failures = []
            queries = panel_queries(dashboard)
            for query in queries:
                found = await prometheus.query(session, _substitute(query.expr), at)
                failures += _problems(query, found)
            for query in variable_queries(dashboard):
                found = await prometheus.query(
                    session, f"count by ({query.legend_labels[0]}) ({_substitute(query.expr)})", at
                )
                offered = {r["metric"].get(query.legend_labels[0]) for r in found}
                if VARIABLES[query.where] not in offered:
                    failures.append(f"{query.where} offers {offered}, not this run's")
            if failures:  # what each target's last scrape before `at` gave, to read the failure
                for sample in await prometheus.query(session, "scrape_samples_scraped", at):
                    failures.append(
                        f"at {at}: {sample['metric']['pod']} {sample['value'][1]} samples"
                    )
            assert failures == [], "\n".join(failures)
            assert len(queries) >= 50
            assert set(scraped) == {"env-0", "env-1", "rollout-0", "learner", "trainer"}
    finally:
        prometheus.stop()
