"""A broadcast's session on vLLM's workers, as the rollout drives it (issue 24's review).

:func:`vllm_engine.receive_through_transfer_engine` makes one ``collective_rpc`` per update
(each worker runs vLLM's start, update and finish and answers with its outcome) and, with
``keepWeightsOnLoad``, one more that puts the kept weights back on every worker when any one
failed: with tensor parallelism 2 a rank that loaded the whole version must not serve it beside
a rank that failed. Here the ``LLMEngine`` is a fake whose two ranks answer as told, and the
worker side (:func:`vllm_worker.receive_session`) runs against a fake vLLM worker whose calls
raise as vLLM's do: it answers, never raises, and leaves no session open.
"""

from __future__ import annotations

from typing import Any

import pytest

from aflowrl.models.errors import BroadcastBrokenError
from aflowrl.rollout import vllm_engine, vllm_worker

OK = {"kind": "ok", "version": 1, "buckets": 3, "bytes": 10, "loaded": 3, "intact": False}
BROKEN = {"kind": "broken", "message": "injected", "loaded": 2, "intact": False}


class TwoRanks:
    """The ``LLMEngine`` surface of one update: two ranks' answers, and the restores asked."""

    def __init__(self, answers: list[dict[str, Any]], restored: list[bool]) -> None:
        self.answers = answers
        self.restored = restored
        self.settled: list[bool] = []

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        assert callable(getattr(vllm_worker.AflowrlWorkerExtension, method))
        if method == "aflowrl_receive_weights":
            return [dict(a) for a in self.answers]
        assert method == "aflowrl_settle_weights"
        self.settled.append(args[0])
        return self.restored if args[0] else [False, False]


@pytest.mark.parametrize(
    ("kept", "restored", "intact"),
    [(True, [True, True], True), (True, [True, False], False), (False, [False, False], False)],
)
def test_one_failed_rank_puts_the_kept_weights_back_on_every_rank(kept, restored, intact):
    engine = TwoRanks([{**OK, "kept": kept}, {**BROKEN, "kept": kept}], restored)
    answers = vllm_engine.receive_through_transfer_engine(engine, {"version": 1})
    assert engine.settled == ([True] if kept else [])
    # The combined verdict the rollout raises on: every rank must hold the old version.
    assert all(a["intact"] for a in answers) is intact


def test_a_complete_update_drops_the_kept_weights():
    engine = TwoRanks([{**OK, "kept": True}, {**OK, "kept": True}], [True, True])
    answers = vllm_engine.receive_through_transfer_engine(engine, {"version": 1})
    assert engine.settled == [False] and [a["kind"] for a in answers] == ["ok", "ok"]


def test_a_failing_rpc_is_a_broken_broadcast_with_the_weights_assumed_mixed():
    class Failing(TwoRanks):
        def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
            raise RuntimeError("Worker failed with error 'boom'")

    with pytest.raises(BroadcastBrokenError, match="boom") as info:
        vllm_engine.receive_through_transfer_engine(Failing([], []), {"version": 1})
    assert info.value.intact is False


class FakeTransferEngine:
    """The backend's surface :func:`vllm_worker.receive_session` uses."""

    def __init__(self) -> None:
        self.outcomes = 0

    def receive_adapters(self) -> None:  # marks it as the aflowrl backend
        raise AssertionError

    def outcome(self) -> dict[str, Any]:
        self.outcomes += 1
        return {"kind": "broken", "message": "recorded", "intact": False}


class FakeWorker:
    """vLLM's worker session calls: ``start`` refuses while a session is open, ``update`` may
    raise before reaching the backend (ending the session), ``finish`` ends it. Its session flag
    is its own (vLLM's ``_weight_update_active`` is private): the rollout tracks the session
    from the calls' documented behaviour, not by reading the flag."""

    def __init__(self, *, active: bool, update_raises: bool) -> None:
        self.weight_transfer_engine = FakeTransferEngine()
        self._open = active
        self.update_raises = update_raises
        self.finishes = 0

    def start_weight_update(self) -> None:
        if self._open:
            raise RuntimeError("start_weight_update called while a weight update is active")
        self._open = True

    def update_weights(self, update_info: dict[str, Any]) -> None:
        if self.update_raises:
            self._open = False
            raise RuntimeError("injected before the backend")

    def finish_weight_update(self) -> None:
        if not self._open:
            raise RuntimeError("finish_weight_update called without a matching start")
        self._open = False
        self.finishes += 1


@pytest.mark.parametrize(
    ("active", "update_raises", "finishes"), [(False, False, 1), (True, False, 2), (False, True, 0)]
)
def test_a_worker_session_answers_and_never_stays_open(active, update_raises, finishes):
    worker = FakeWorker(active=active, update_raises=update_raises)
    answer = vllm_worker.receive_session(worker, {"version": 1})
    assert answer == {"kind": "broken", "message": "recorded", "intact": False}
    assert not worker._open and worker.finishes == finishes


def test_a_worker_without_the_backend_answers_broken():
    answer = vllm_worker.receive_session(object(), {"version": 1})
    assert answer["kind"] == "broken" and "weight-transfer engine" in answer["message"]


def test_a_group_call_failing_on_one_rank_is_an_answer_and_the_rollout_names_the_rank():
    class Unreachable(FakeWorker):
        def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
            raise RuntimeError(f"no store at {init_info['master_address']}")

        def shutdown_weight_transfer_engine(self) -> None:
            pass

    worker = Unreachable(active=False, update_raises=False)
    failure = vllm_worker.join_group(worker, {"master_address": "10.0.0.9"})
    assert failure == "RuntimeError: no store at 10.0.0.9"
    assert vllm_worker.leave_group(worker) == ""
    with pytest.raises(RuntimeError, match=r"^rank 1: RuntimeError: no store at 10\.0\.0\.9$"):
        vllm_engine._raise_failures(["", failure])
    vllm_engine._raise_failures(["", ""])
