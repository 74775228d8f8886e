"""``aflowrl train`` refuses bad inputs before any work starts (exit 2, the problem named)."""

from __future__ import annotations

import pytest

from aflowrl.cli import main
from aflowrl.local.processes import free_ports


def _train(tmp_path, capsys, spec_text: str | None, *extra: str) -> tuple[int, str]:
    args = ["train", "--run-dir", str(tmp_path / "run"), "--no-progress", *extra]
    if spec_text is not None:
        spec = tmp_path / "run.yaml"
        spec.write_text(spec_text)
        args += ["-f", str(spec)]
    code = main(args)
    return code, capsys.readouterr().err


def _nothing_started(tmp_path) -> bool:
    return not (tmp_path / "run" / "logs").exists()


def test_targets_come_all_three_or_none(tmp_path, capsys):
    code, err = _train(tmp_path, capsys, None, "--env", "dns:///env:50051")
    assert code == 2
    assert "--rollout, --learner: give all of --env, --rollout and --learner" in err


def test_a_spec_error_names_the_field(tmp_path, capsys):
    code, err = _train(tmp_path, capsys, "trainer: {groupSize: 0}\n")
    assert code == 2 and "spec.trainer.groupSize" in err
    assert _nothing_started(tmp_path)


def test_an_unknown_benchmark_is_named(tmp_path, capsys):
    code, err = _train(tmp_path, capsys, "environment: {benchmarks: [gsm9k]}\n")
    assert code == 2 and "spec.environment.benchmarks[0]" in err and "gsm9k" in err
    assert _nothing_started(tmp_path)


def test_a_missing_data_dir_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    code, err = _train(tmp_path, capsys, "environment: {benchmarks: [mbpp]}\n")
    assert code == 2 and "spec.environment.data.dir" in err
    assert _nothing_started(tmp_path)


def test_an_unreachable_executor_is_named(tmp_path, capsys):
    port = free_ports(1)[0]
    spec = f"environment: {{executor: {{type: openai, baseUrl: 'http://127.0.0.1:{port}/v1'}}}}\n"
    code, err = _train(tmp_path, capsys, spec)
    assert code == 2 and "spec.environment.executor.baseUrl" in err and "cannot reach" in err
    assert _nothing_started(tmp_path)


def test_a_missing_spec_file_is_named(tmp_path, capsys):
    code = main(["train", "-f", str(tmp_path / "nope.yaml")])
    assert code == 2 and "nope.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--help"])
def test_help_lists_both_modes(flag, capsys):
    with pytest.raises(SystemExit):
        main(["train", flag])
    out = capsys.readouterr().out
    assert "--env" in out and "--run-dir" in out and "-f" in out
