"""``aflowrl-operator`` / ``python -m aflowrl_operator`` and the operator's own metrics."""

from __future__ import annotations

import subprocess
import sys

from aflowrl.common.metrics import check_metric_name, exported_metric_names
from aflowrl_operator.cli import build_parser, main
from aflowrl_operator.metrics import OperatorMetrics


def test_help_is_instant_and_imports_no_kopf():
    code = (
        "import sys\n"
        "from aflowrl_operator.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print(sorted(m for m in ('kopf', 'kubernetes', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
    help_run = subprocess.run(
        [sys.executable, "-m", "aflowrl_operator", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert help_run.returncode == 0 and "--resync-interval" in help_run.stdout


def test_arguments():
    args = build_parser().parse_args(["-n", "team-a", "-n", "team-*", "--log-format", "json"])
    assert args.namespace == ["team-a", "team-*"] and args.log_format == "json"
    assert build_parser().parse_args([]).namespace == []
    assert main(["--resync-interval", "0"]) == 2
    peering = build_parser().parse_args(["--peering", "aflow", "--priority", "7"])
    assert (peering.peering, peering.priority) == ("aflow", 7)


def test_the_check_task_refuses_a_malformed_target(capsys):
    assert main(["--check", "no-slash"]) == 1
    assert "--check wants NAMESPACE/DEPLOYMENT" in capsys.readouterr().err


def test_replicas_get_different_peering_priorities(monkeypatch):
    from aflowrl_operator import cli

    seen = set()
    for host in ("aflow-rl-operator-7d9f-abcde", "aflow-rl-operator-7d9f-fghij"):
        monkeypatch.setattr(cli.socket, "gethostname", lambda host=host: host)
        seen.add(cli._host_priority())
    assert len(seen) == 2


def test_operator_metric_names_follow_the_house_convention():
    metrics = OperatorMetrics()
    metrics.reconciles.labels("ok").inc()
    metrics.child_writes.labels("Deployment", "created").inc()
    metrics.reconcile_duration.observe(0.1)
    metrics.handler_calls.labels("resync", "ok").inc()
    metrics.handler_duration.labels("resync").observe(0.1)
    exported = exported_metric_names(metrics.registry)
    families = {name for name in exported if name.startswith("aflowrl_")}
    for name in (
        "aflowrl_operator_reconciles_total",
        "aflowrl_operator_reconcile_duration_seconds",
        "aflowrl_operator_child_writes_total",
        "aflowrl_operator_handler_calls_total",
        "aflowrl_operator_handler_duration_seconds",
    ):
        assert name in families
        check_metric_name(name)
    # The operator's own process, as every service exports it.
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= exported


def test_the_operator_metrics_declare_their_labels():
    metrics = OperatorMetrics()
    metrics.reconciles.labels("ok").inc()
    metrics.child_writes.labels("Job", "created").inc()
    metrics.handler_calls.labels("child", "ok").inc()
    metrics.handler_duration.labels("child").observe(0.2)
    metrics.reconcile_duration.observe(0.2)
    seen: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name.startswith("aflowrl_operator_"):
                labels = set(sample.labels) - {"le"}
                seen.setdefault(family.name, set()).update(labels)
    declared = {
        name.removesuffix("_total"): set(labels) for name, labels in metrics.label_names.items()
    }
    assert seen == declared
