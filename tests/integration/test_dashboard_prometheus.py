"""Every query of the Grafana dashboard returns data from a real Prometheus scraping a local run.

Debian's ``prometheus`` (installed by ``make monitoring-tools``) scrapes, every second, the
``/metrics`` of each service of a short local training, of its trainer and of an operator's
metrics registry: the endpoints a PodMonitor (and the operator's ServiceMonitor) scrapes in a
cluster, with the labels it adds there (``namespace``, ``pod``,
``aflowrl_io_run``, ``app_kubernetes_io_component``...). After the run, each panel query, with
the dashboard's template variables substituted, is evaluated through Prometheus's HTTP API after
the run: each must return series carrying the labels its legend shows, and a number. The rate
windows are the dashboard's own.

Nothing depends on how fast the machine is: training starts only once Prometheus has scraped
every service (and knows the trainer's endpoint), the trainer's metrics stay served after the
run, and the queries wait until every target has been scraped successfully after the run ended,
so every counter's final value is in, with the run's samples inside every rate window.

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

from aflowrl.common.metrics import MetricsHttpServer
from aflowrl.config import RunSpec
from aflowrl.local.launcher import local_services, local_spec
from aflowrl.local.processes import free_ports
from aflowrl.trainer import app
from aflowrl.trainer.metrics import TrainerMetrics
from aflowrl_operator.metrics import HANDLERS, OperatorMetrics
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

    async def scraped(
        self,
        session: aiohttp.ClientSession,
        pods: set[str],
        *,
        up: set[str],
        after: float,
        timeout_s: float = 300.0,
    ) -> None:
        """Wait until Prometheus scrapes every pod of ``pods`` and the latest scrape of each of
        ``up`` succeeded, started after ``after`` (Unix seconds)."""
        deadline = time.monotonic() + timeout_s
        seen: dict[str, tuple[str, float]] = {}
        while time.monotonic() < deadline:
            async with session.get(f"{self.url}/api/v1/targets") as reply:
                body = await reply.json()
            seen = {
                t["labels"]["pod"]: (t["health"], _unix(t["lastScrape"]))
                for t in body["data"]["activeTargets"]
            }
            if set(seen) == pods and all(
                seen[pod][0] == "up" and seen[pod][1] > after for pod in up
            ):
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"targets not scraped after {timeout_s}s: {seen}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


def _unix(rfc3339: str) -> float:
    """Prometheus's lastScrape (RFC 3339, nanoseconds, or the zero time) in Unix seconds."""
    from datetime import datetime

    if rfc3339.startswith("0001-"):
        return 0.0
    head, _, tail = rfc3339.rstrip("Z").partition(".")
    fraction = float(f"0.{tail[:6]}") if tail else 0.0
    return datetime.fromisoformat(head + "+00:00").timestamp() + fraction


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
    trainer_port, operator_port = free_ports(2)
    run_dir = tmp_path / "run"
    spec = local_spec(RunSpec.from_yaml(SPEC), run_dir)
    metrics = TrainerMetrics()
    operator = OperatorMetrics()  # the operator's /metrics, as its ServiceMonitor scrapes it
    try:
        async with (
            aiohttp.ClientSession() as session,
            local_services(spec, run_dir) as (targets, _group),
            MetricsHttpServer(metrics.registry, trainer_port, host="127.0.0.1"),
            MetricsHttpServer(operator.registry, operator_port, host="127.0.0.1"),
        ):
            await prometheus.ready(session)
            scraped = {
                **targets.metrics,
                "trainer": f"127.0.0.1:{trainer_port}",
                "operator": f"127.0.0.1:{operator_port}",
            }
            _write_targets(prometheus.targets, scraped)
            pods = {f"{RUN}-{name}" for name in scraped}
            await prometheus.scraped(session, pods, up=pods, after=time.time())
            for handler in HANDLERS:  # the operator's passes over the run while it trains
                operator.handler_calls.labels(handler, "ok").inc()
                operator.handler_duration.labels(handler).observe(0.05)
            services = app.connect(
                spec, env=targets.env, rollout=targets.rollout, learner=targets.learner
            )
            await app.train(spec, services, run_dir, metrics=metrics)
            records = (run_dir / "metrics.jsonl").read_text().splitlines()
            assert len(records) == 3
            # Every target scraped after the run: every final value is in.
            await prometheus.scraped(session, pods, up=pods, after=time.time())
            at = time.time()
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
            assert failures == [], "\n".join(failures)
            assert len(queries) >= 50
            assert set(scraped) == {
                "env-0",
                "env-1",
                "rollout-0",
                "learner",
                "trainer",
                "operator",
            }
    finally:
        prometheus.stop()
