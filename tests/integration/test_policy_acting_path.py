"""One acting path, the supervised warm start and the policy's own value, over real services.

A learner and a rollout run as processes. The learner is trained with the warm start's
supervised objective towards one action (by its text) and a value target, the weights are pushed
to the rollout and exported as a checkpoint directory; then:

* the trainer's path (the rollout's ``ScoreCandidates`` read by :mod:`aflowrl.trainer.acting`)
  and ``aflowrl optimize --proposer policy``'s path (:class:`aflowrl.search.policy.PolicyProposer`
  on the exported checkpoint) give the same action distribution and the same V(s);
* the distribution follows the actions' texts: permuting the candidate list permutes it;
* the trained action got the mass and V moved towards its target; the RL objective trains the
  value replies too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from aflowrl._proto.v1 import learner_pb2, rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.search import encoding
from aflowrl.search.episode import Observation
from aflowrl.trainer import weight_sync
from aflowrl.trainer.acting import ValueReader, action_log_probs, prompt_of
from aflowrl.trainer.clients import LearnerClient, RolloutClient, TrainRow
from aflowrl.trainer.rows import Decision

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, learner_and_rollout

OBSERVATION = (
    "# Optimising an agentic workflow for humaneval (code tasks)\n"
    "## Workflow to modify: #0, validation score 84.8%\n"
    "nodes:\n  generate = CustomCodeGenerate(problem=problem)  -> solution\n"
    "## Admissible actions (reply with one of them)\n"
)
ACTIONS = (
    "add ScEnsemble after generate samples=5",
    "wrap generate in test_fix",
    "remove generate",
    "set generate samples=3",
)
TARGET = 1  # "wrap generate in test_fix"
VALUE_TARGET = 0.3


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("acting")
    spec = tmp / "spec.yaml"
    # The warm start's own learning rate (trainer.warmStart.lr) beside the RL one.
    spec.write_text(SPEC.replace("lr: 0.001", "lr: 0.01") + "trainer: {warmStart: {lr: 0.015}}\n")
    with learner_and_rollout(spec, tmp) as (learner, rollout):
        yield RunSpec.from_yaml(spec.read_text()), learner, rollout, tmp


async def _read(client: RolloutClient, reader: ValueReader, actions: tuple[str, ...]):
    """(log pi over ``actions``, V) as the trainer's ChoiceActor reads them."""
    text = OBSERVATION + "".join(f"- {a}\n" for a in ACTIONS)
    item = rollout_pb2.CandidateSet(
        prompt=prompt_of(text),
        candidates=encoding.action_replies(actions) + encoding.value_replies(),
    )
    [(scores, _)] = await client.score([item])
    log_pi = action_log_probs(scores, len(actions))
    value = reader.read([list(c.values) for c in scores.candidate_logprobs[len(actions) :]])
    ids = tuple(tuple(c.ids) for c in scores.candidate_token_ids)
    return log_pi, value, scores, ids


async def test_one_acting_path_trained_by_the_warm_start(services):
    spec, learner, rollout, tmp = services
    reader = ValueReader.of(spec)
    assert reader is not None
    client = RolloutClient([rollout.target])
    learner_client = LearnerClient(learner.target)
    sync = weight_sync.GrpcWeightSync(learner.target, [rollout.target])
    try:
        before, v_before, scores, ids = await _read(client, reader, ACTIONS)
        decision = Decision(
            action=encoding.action_reply(ACTIONS[0]),
            prompt_ids=tuple(scores.prompt_token_ids),
            candidate_ids=ids[: len(ACTIONS)],
            chosen=0,
            logprobs=(float(before[0]),),
            value_ids=ids[len(ACTIONS) :],
        )
        weights = tuple(1.0 if k == TARGET else 0.0 for k in range(len(ACTIONS)))
        row = TrainRow(decision, (), (), value_target=VALUE_TARGET, target_weights=weights)
        losses = []
        for _ in range(12):
            metrics, _ = await learner_client.train([row] * 4, 0, supervised=True)
            losses.append(metrics["losses/policy"])
        assert losses[-1] < losses[0] * 0.5, losses
        assert metrics["charts/lr"] == pytest.approx(0.015)  # trainer.warmStart.lr
        assert (await sync.push()).ok
        after, v_after, _, _ = await _read(client, reader, ACTIONS)
        assert int(np.argmax(after)) == TARGET and np.exp(after[TARGET]) > 0.8
        assert abs(v_after - VALUE_TARGET) < abs(v_before - VALUE_TARGET) / 2

        # The distribution follows the texts: a permuted list gives the permuted distribution.
        order = (2, 0, 3, 1)
        permuted, v_permuted, _, _ = await _read(client, reader, tuple(ACTIONS[k] for k in order))
        assert np.allclose(permuted, after[list(order)], atol=1e-5)
        assert v_permuted == pytest.approx(v_after, abs=1e-6)

        # aflowrl optimize --proposer policy on the exported checkpoint reads the same.
        export = await learner_client.stub.ExportWeights(
            learner_pb2.ExportWeightsRequest(path=str(tmp / "trained"))
        )
        from aflowrl.search.policy import PolicyProposer

        value = spec.policy.value
        proposer = PolicyProposer.load(export.path, value_range=(value.min, value.max))
        text = OBSERVATION + "".join(f"- {a}\n" for a in ACTIONS)
        read = proposer.read(Observation(text, ACTIONS, "0" * 64, "choice"))
        assert np.allclose(read.log_pi, after, atol=1e-5)
        assert read.value == pytest.approx(v_after, abs=1e-5)
        shuffled = proposer.read(
            Observation(text, tuple(ACTIONS[k] for k in order), "0" * 64, "choice")
        )
        assert np.allclose(shuffled.log_pi, after[list(order)], atol=1e-5)

        # The RL objective trains the value replies beside the policy loss.
        rl_row = TrainRow(decision, (float(before[0]),), (0.0,), value_target=-0.2)
        for _ in range(6):
            metrics, _ = await learner_client.train([rl_row] * 4, 1)
        assert metrics["charts/value_mae"] < abs(v_after + 0.2)
        assert metrics["charts/lr"] == pytest.approx(0.01)  # learner.optimizer.lr
        assert metrics["losses/policy_value"] > 0
    finally:
        await client.close()
        await learner_client.close()
        await sync.close()
