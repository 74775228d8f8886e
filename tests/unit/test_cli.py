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


def test_every_exit_code_is_documented_with_its_number():
    import re
    from pathlib import Path

    from aflowrl.cli.exitcodes import ExitCode

    page = Path(__file__).parents[2] / "docs" / "reference" / "exit-codes.md"
    documented = {int(n) for n in re.findall(r"^\| (\d+) \|", page.read_text(), re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}


def test_eval_draws_no_progress_bar_into_a_log(aflow_data, tmp_path):
    """stderr is a pipe here, as in a log file or a pod: no bar, so no carriage returns."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aflowrl",
            "eval",
            "--workflow",
            "io",
            "--benchmark",
            "humaneval",
            "--executor",
            "surrogate",
            "--data-dir",
            str(aflow_data),
            "--limit",
            "2",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert "\r" not in out.stderr
    assert "io" in out.stdout  # the table still comes


def test_a_progress_bar_is_drawn_only_on_a_terminal_and_never_with_no_progress():
    import io

    from aflowrl.common.progress import bar_enabled, progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert bar_enabled(None, Terminal()) and not bar_enabled(None, io.StringIO())
    assert not bar_enabled(False, Terminal())
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        bar = progress_bar(3, unit="run", stream=stream)
        bar.update(3)
        bar.close()
        assert ("\r" in stream.getvalue()) is drawn
    quiet = Terminal()
    progress_bar(3, unit="run", enabled=False, stream=quiet).close()
    assert quiet.getvalue() == ""


def test_help_shows_each_options_default():
    from aflowrl.cli import build_parser

    parser = build_parser()
    eval_help = parser._subparsers._group_actions[0].choices["eval"].format_help()  # type: ignore[union-attr]
    assert "(default: 16)" in " ".join(eval_help.split())
    assert "(default: None)" not in eval_help and "(default: False)" not in eval_help


def test_every_command_taking_a_run_document_takes_it_with_f_and_file_and_still_spec():
    from aflowrl.cli import build_parser

    parser = build_parser()
    for command in (
        ["spec", "validate"],
        ["train"],
        ["optimize", "--benchmark", "gsm8k", "--executor", "surrogate"],
        ["serve", "env"],
    ):
        for flag in ("-f", "--file", "--spec"):
            args = parser.parse_args([*command, flag, "run.yaml"])
            assert args.spec == "run.yaml", (command, flag)
        usage = parser._subparsers._group_actions[0].choices[command[0]].format_help()  # type: ignore[union-attr]
        assert "-f FILE, --file FILE" in usage and "--spec" not in usage, command[0]


def test_the_pod_commands_of_older_operators_still_parse():
    """Operators before the switch to ``-f`` wrote ``--spec FILE`` into every pod's command;
    such pods outlive an operator upgrade (a running Job keeps its template)."""
    from aflowrl.cli import build_parser

    parser = build_parser()
    spec = "/etc/aflowrl/spec.yaml"
    for argv in (
        ["serve", "env", "--spec", spec, "--host", "0.0.0.0"],
        ["serve", "rollout", "--spec", spec, "--host", "0.0.0.0"],
        ["serve", "rollout-worker", "--spec", spec],
        ["serve", "learner", "--spec", spec],
        ["train", "--spec", spec, "--env", "e:1", "--rollout", "r:2", "--learner", "l:3"],
    ):
        args = parser.parse_args(argv)
        assert args.spec == spec, argv


def test_spec_prints_documents_as_yaml_or_json(tmp_path, capsys):
    import json

    assert main(["spec", "default", "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert main(["spec", "default"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json
    run = tmp_path / "run.yaml"
    run.write_text("trainer:\n  iterations: 3\n")
    assert main(["spec", "resolve", "--file", str(run), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["trainer"]["iterations"] == 3


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
