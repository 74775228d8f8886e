"""aflowrl.envs reads the environment at each access, secrets from files first."""

from __future__ import annotations

import os

import pytest

from aflowrl import envs


def test_defaults_and_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("AFLOWRL_LOG_LEVEL", raising=False)
    assert envs.AFLOWRL_LOG_LEVEL == "INFO"
    monkeypatch.setenv("AFLOWRL_LOG_LEVEL", "debug")
    assert envs.AFLOWRL_LOG_LEVEL == "DEBUG"
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert envs.WORLD_SIZE == 4


@pytest.mark.parametrize("name", ["AFLOWRL_EXECUTOR_API_KEY", "WANDB_API_KEY"])
def test_secret_file_wins_over_variable(monkeypatch, tmp_path, name):
    key = tmp_path / "key"
    key.write_text("from-file\n")
    monkeypatch.setenv(name, "from-env")
    assert getattr(envs, name) == "from-env"
    monkeypatch.setenv(f"{name}_FILE", str(key))
    assert getattr(envs, name) == "from-file"


def test_unknown_variable_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError):
        envs.AFLOWRL_NOPE  # noqa: B018


def test_scoped_sets_a_variable_for_a_block_only(monkeypatch):
    monkeypatch.delenv("AFLOWRL_TEST_SCOPED", raising=False)
    with envs.scoped("AFLOWRL_TEST_SCOPED", "2"):
        assert os.environ["AFLOWRL_TEST_SCOPED"] == "2"
    assert "AFLOWRL_TEST_SCOPED" not in os.environ
    monkeypatch.setenv("AFLOWRL_TEST_SCOPED", "3")
    with pytest.raises(RuntimeError), envs.scoped("AFLOWRL_TEST_SCOPED", "2"):
        raise RuntimeError("the block fails")
    assert os.environ["AFLOWRL_TEST_SCOPED"] == "3"
