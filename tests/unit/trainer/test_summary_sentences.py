"""The end-of-run summary's sentences: the best workflow against the strongest classic baseline,
and the trained policy's lead, or why it has none."""

from __future__ import annotations

from aflowrl.trainer.evaluate import EpisodeResult, lead_sentence
from aflowrl.trainer.final import FinalRow, best_against_baselines


def _row(name: str, test: float, validation: float) -> FinalRow:
    return FinalRow(name, name, test, 0.0, 131, validation, 100, 0, 0.0, 1.0, "humaneval")


def _episode(seed_score: float, gain: float) -> EpisodeResult:
    return EpisodeResult("humaneval", 1, "e", gain, seed_score, seed_score + gain, gain, 4, 0, 0)


def test_a_best_workflow_below_a_baseline_says_which_and_what_it_was_chosen_by():
    rows = [
        _row("best (162a51dd)", 0.901, 0.939),
        _row("seed", 0.863, 0.848),
        _row("cot_sc", 0.908, 0.909),
        _row("medprompt", 0.924, 0.939),
    ]
    sentence = best_against_baselines(rows)
    assert sentence is not None
    assert "does not beat medprompt (0.924)" in sentence and "0.901" in sentence
    assert "validation" in sentence and "0.939" in sentence


def test_a_best_workflow_no_better_than_a_baseline_on_validation_says_none_was_found():
    rows = [
        _row("best (162a51dd)", 0.916, 0.939),
        _row("seed", 0.863, 0.848),
        _row("cot_sc", 0.908, 0.909),
        _row("medprompt", 0.924, 0.939),
    ]
    sentence = best_against_baselines(rows)
    assert sentence is not None
    assert "does not beat medprompt (0.924)" in sentence and "0.916" in sentence
    assert "no workflow the search kept scored above medprompt" in sentence
    assert "(0.939 against 0.939)" in sentence
    above = [_row("best (1)", 0.916, 0.970), *rows[1:]]
    sentence = best_against_baselines(above)
    assert sentence is not None and "no workflow" not in sentence
    assert "where it scored 0.970 against medprompt's 0.939" in sentence


def test_a_best_workflow_above_every_baseline_says_so():
    rows = [_row("best (1)", 0.95, 0.97), _row("seed", 0.86, 0.85), _row("medprompt", 0.92, 0.94)]
    sentence = best_against_baselines(rows)
    assert sentence is not None and "beats every classic baseline" in sentence
    assert "medprompt: 0.920" in sentence


def test_no_best_workflow_no_sentence():
    assert best_against_baselines([_row("seed", 0.86, 0.85), _row("cot", 0.88, 0.85)]) is None


def test_a_lead_is_reported_and_no_lead_names_the_room_the_seed_left():
    start = [_episode(0.75, 0.0), _episode(0.75, 0.0)]
    led = lead_sentence([_episode(0.75, 0.25), _episode(0.75, 0.0)], start)
    assert led is not None and "leads" in led and "+0.1250" in led
    level = lead_sentence([_episode(0.9167, 0.0)] * 2, [_episode(0.9167, 0.0)] * 2)
    assert level is not None and "no lead" in level and "0.917" in level and "0.083" in level
    assert "already gains" not in level
    behind = lead_sentence(
        [_episode(0.8958, 0.0), _episode(0.8958, 0.0834)],
        [_episode(0.8958, 0.0834), _episode(0.8958, 0.0)],
    )
    assert (
        behind is not None and "no lead (+0.0000, +0.0 SE)" in behind and "0.104 to gain" in behind
    )
    assert "the policy it started from already gains +0.0417" in behind
    noisy = lead_sentence(
        [_episode(0.75, 0.25), _episode(0.75, 0.0), _episode(0.75, 0.1)], [_episode(0.75, 0.0)] * 3
    )
    assert noisy is not None and "+0.1167 best-gain (3 held-out tasks, +1.6 SE)" in noisy


def test_the_lead_over_the_random_proposer_follows_when_it_was_played_alike():
    start = [_episode(0.5, 0.0), _episode(0.5, 0.05)]
    trained = [_episode(0.5, 0.1), _episode(0.5, 0.1)]
    ahead = lead_sentence(trained, start, random=[_episode(0.5, 0.0), _episode(0.5, 0.1)])
    assert ahead is not None and ahead.endswith(
        "Over the random proposer it leads by +0.0500 (+1.0 SE)."
    )
    level = lead_sentence(trained, start, random=[_episode(0.5, 0.1), _episode(0.5, 0.15)])
    assert level is not None
    assert level.endswith("It has no lead over the random proposer (-0.0250, -1.0 SE).")
    assert "random" not in (lead_sentence(trained, start, random=trained[:1]) or "")


def test_policies_not_played_alike_get_no_sentence():
    assert lead_sentence([_episode(0.5, 0.1)], []) is None
