"""Experiment trackers: the spec's loggers list, missing libraries, the fan-out, the API key."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from aflowrl.config import RunSpec
from aflowrl.config.errors import ConfigError
from aflowrl.errors import InvalidInputError
from aflowrl.trainer import tracking


def test_every_run_logs_to_the_console_and_tensorboard_by_default():
    assert RunSpec().monitoring.loggers == ["console", "tensorboard"]


def test_a_logger_listed_twice_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"spec\.monitoring\.loggers: loggers lists wandb more"):
        RunSpec.from_document({"monitoring": {"loggers": ["wandb", "wandb"]}})


def test_an_unknown_logger_is_refused():
    with pytest.raises(ConfigError, match=r"spec\.monitoring\.loggers"):
        RunSpec.from_document({"monitoring": {"loggers": ["neptune"]}})


def test_a_missing_tracker_library_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    tracking.check_available(["console", "tensorboard", "mlflow"])  # these are installed
    with pytest.raises(InvalidInputError) as info:
        tracking.check_available(["tensorboard", "wandb"])
    message = str(info.value)
    assert "\n" not in message and "aflow-rl[tracking]" in message
    assert info.value.field == "spec.monitoring.loggers"


def test_online_wandb_without_an_api_key_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_API_KEY_FILE", raising=False)
    spec = RunSpec.from_document({"monitoring": {"loggers": ["wandb"]}})
    with pytest.raises(InvalidInputError) as info:
        tracking.open_trackers(spec, tmp_path)
    assert info.value.field == "spec.monitoring.wandb.mode" and "WANDB_API_KEY" in str(info.value)
    assert not (tmp_path / "wandb").exists()  # nothing was started


def test_the_scalars_are_the_records_finite_numbers():
    record = {
        "iteration": 3,
        "time": "2026-01-01T00:00:00Z",
        "policy_version": 4,
        "charts/episode_return": 0.25,
        "losses/kl": float("nan"),
        "charts/clipfrac": None,
        "flag": True,
    }
    assert tracking.scalars_of(record) == {"policy_version": 4.0, "charts/episode_return": 0.25}


class _Recorder:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail
        self.logged: list[tuple[int, dict]] = []
        self.closed = 0

    def log(self, step, scalars):
        if self.fail:
            raise OSError("disk full")
        self.logged.append((step, dict(scalars)))

    def close(self):
        self.closed += 1


def test_a_failing_tracker_is_dropped_and_the_others_go_on(caplog):
    good, bad = _Recorder("good"), _Recorder("bad", fail=True)
    trackers = tracking.Trackers([bad, good])
    with caplog.at_level(logging.ERROR, logger="aflowrl.trainer.tracking"):
        trackers.log(0, {"charts/best_score": 0.5})
        trackers.log(1, {"charts/best_score": 0.6})
    assert good.logged == [(0, {"charts/best_score": 0.5}), (1, {"charts/best_score": 0.6})]
    assert trackers.names == ["good"] and bad.closed == 1
    assert "'bad' failed" in caplog.text
    trackers.close()
    assert good.closed == 1 and bad.closed == 1


def test_tensorboard_events_load_in_tensorboards_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = RunSpec.from_document({"monitoring": {"tensorboard": {"dir": str(tmp_path / "tb")}}})
    with tracking.open_trackers(spec, tmp_path / "run") as trackers:
        assert trackers.names == ["console", "tensorboard"]
        for step in range(3):
            trackers.log(step, {"iteration": step, "charts/best_score": 0.5 + 0.1 * step})
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    values = [(s.step, s.value) for s in events.Scalars("charts/best_score")]
    assert [v[0] for v in values] == [0, 1, 2]
    assert [v[1] for v in values] == pytest.approx([0.5, 0.6, 0.7])


def test_the_console_logger_writes_the_update_diagnostics(caplog):
    with caplog.at_level(logging.INFO, logger="aflowrl.trainer.tracking"):
        tracking.ConsoleTracker().log(2, {"losses/kl": 0.0125, "charts/clipfrac": 0.25})
    assert "iteration 3 update: kl 0.0125  clipfrac 0.25" in caplog.text


def test_train_refuses_a_logger_without_its_library_before_starting_anything(
    tmp_path, capsys, monkeypatch
):
    from aflowrl.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    spec = tmp_path / "run.yaml"
    spec.write_text("monitoring: {loggers: [console, mlflow]}\n")
    code = main(["train", "-f", str(spec), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "spec.monitoring.loggers" in err and "pip install 'aflow-rl[tracking]'" in err
    assert not (tmp_path / "run" / "logs").exists()  # no service was started


def test_a_resumed_runs_repeated_iterations_replace_the_old_ones_in_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = RunSpec.from_document({"monitoring": {"loggers": ["tensorboard"]}})
    with tracking.open_trackers(spec, tmp_path) as first:
        for step in range(4):  # checkpointed after iteration 1, stopped after 3
            first.log(step, {"charts/best_score": float(step)})
    with tracking.open_trackers(spec, tmp_path) as resumed:
        for step in range(2, 5):
            resumed.log(step, {"charts/best_score": 10.0 + step})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    logged = [(s.step, s.value) for s in events.Scalars("charts/best_score")]
    assert logged == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0), (4, 14.0)]
