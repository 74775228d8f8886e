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


def _what_train_runs(monkeypatch, argv):
    """The RunSpec ``aflowrl train ARGV`` would run locally (the run itself not started)."""
    from aflowrl.cli import train

    monkeypatch.delenv("AFLOWRL_SPEC_FILE", raising=False)
    seen = []

    def local(spec, args):
        seen.append(spec)

        async def nothing():
            return 0

        return nothing()

    monkeypatch.setattr(train, "_local", local)
    assert main(["train", *argv]) == 0
    (spec,) = seen
    return spec


def test_spec_default_is_the_document_train_runs_without_a_file(monkeypatch, capsys):
    from aflowrl.config import RunSpec

    assert main(["spec", "default"]) == 0
    printed = RunSpec.from_document(yaml.safe_load(capsys.readouterr().out))
    ran = _what_train_runs(monkeypatch, [])
    assert printed.to_document() == ran.to_document()
    # the tuned settings travel with it (RunSpec()'s own defaults suit large models)
    assert printed.learner.optimizer.lr != RunSpec().learner.optimizer.lr


def test_spec_default_prints_the_tuned_settings_with_where_they_came_from(capsys):
    assert main(["spec", "default"]) == 0
    out = capsys.readouterr().out
    assert "bench/learning.py" in out and "tuning" in out


def test_a_preset_is_what_train_runs_with_it(monkeypatch, capsys):
    from aflowrl.config import RunSpec

    assert main(["spec", "default", "--preset", "tiny-cpu"]) == 0
    printed = RunSpec.from_document(yaml.safe_load(capsys.readouterr().out))
    ran = _what_train_runs(monkeypatch, ["--preset", "tiny-cpu"])
    assert printed.to_document() == ran.to_document()
    assert ran.rollout.resources.gpus == 0 and ran != _what_train_runs(monkeypatch, [])


def test_an_unknown_preset_lists_the_known_ones(capsys):
    assert main(["spec", "default", "--preset", "7b"]) == 2
    err = capsys.readouterr().err
    assert "--preset" in err and "tiny-cpu" in err and "default" in err
    assert "Traceback" not in err


def test_train_refuses_a_file_and_a_preset_together(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("trainer: {iterations: 1}\n")
    assert main(["train", "-f", str(run), "--preset", "tiny-cpu"]) == 2
    assert "--preset" in capsys.readouterr().err
