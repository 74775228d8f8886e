"""The aflowrl command line: instant help, clear errors, the CRD and spec commands."""

from __future__ import annotations

import subprocess
import sys

import yaml

from aflowrl.cli import main


def test_help_imports_nothing_heavy():
    code = (
        "import sys; from aflowrl.cli import build_parser; build_parser().format_help(); "
        "heavy = [m for m in ('torch', 'grpc', 'transformers', 'vllm', 'kopf', 'pydantic') "
        "if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_crd_command_prints_the_crd(capsys):
    assert main(["crd"]) == 0
    crd = yaml.safe_load(capsys.readouterr().out)
    assert crd["metadata"]["name"] == "trainingruns.aflowrl.io"


def test_spec_validate_names_the_field(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("trainer:\n  groupSize: 0\n")
    assert main(["spec", "validate", "-f", str(run)]) == 2
    err = capsys.readouterr().err
    assert "spec.trainer.groupSize" in err and str(run) in err


def test_spec_missing_file_is_a_clear_error(capsys):
    assert main(["spec", "validate", "-f", "/nonexistent/run.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_spec_default_round_trips(capsys):
    assert main(["spec", "default"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    from aflowrl.config import RunSpec

    assert RunSpec.from_document(doc) == RunSpec()


def test_optimize_never_pays_for_second_readings_of_rewards(tmp_path):
    import argparse

    from aflowrl.cli import optimize

    spec = tmp_path / "run.yaml"
    spec.write_text("environment: {evaluation: {resampleFraction: 0.5, maxProblems: 7}}\n")
    parser = argparse.ArgumentParser()
    optimize.add_arguments(parser)
    args = parser.parse_args(
        ["--benchmark", "gsm8k", "--executor", "surrogate", "-f", str(spec), "--selection", "ucb"]
    )
    _, _, evaluation = optimize._settings(args)
    assert evaluation.resample_fraction == 0.0 and evaluation.max_problems == 7
