"""The surrogate's behaviour: determinism, sampling, plausible wrong answers, reviews, votes."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter

import pytest

from aflowrl.benchmarks import get_benchmark
from aflowrl.executor.base import Message
from aflowrl.executor.surrogate import SurrogateExecutor, load_calibration
from aflowrl.workflow import parsing, prompts


async def _ask(executor, prompt, *, seed, temperature=None, n=1):
    result = await executor.chat([Message("user", prompt)], seed=seed, temperature=temperature, n=n)
    return result.texts


async def test_the_same_request_and_seed_give_the_same_answer(all_problems, surrogate):
    other = SurrogateExecutor(all_problems)
    for problem in all_problems[::301]:
        prompt = prompts.custom("Think step by step.", problem.question)
        first = await _ask(surrogate, prompt, seed=7, n=3)
        assert first == await _ask(other, prompt, seed=7, n=3)
        assert first == await _ask(surrogate, prompt, seed=7, n=3)


async def test_seed_and_temperature_change_samples_as_a_model_would(problems, surrogate):
    gsm8k = get_benchmark("gsm8k")
    chosen = problems["gsm8k"][:150]

    async def accuracy_and_variety(temperature):
        scores, varied = [], 0
        for problem in chosen:
            prompt = prompts.custom(None, problem.question)
            texts = [
                (await _ask(surrogate, prompt, seed=s, temperature=temperature))[0]
                for s in range(6)
            ]
            scores += [gsm8k.score_answer(t, problem.gold) for t in texts]
            varied += len({gsm8k.score_detail(t, problem.gold).extracted for t in texts}) > 1
        return statistics.fmean(scores), varied

    cold, cold_varied = await accuracy_and_variety(0.0)
    warm, warm_varied = await accuracy_and_variety(1.0)
    hot, hot_varied = await accuracy_and_variety(1.8)
    assert cold_varied == 0  # temperature 0: the mode, whatever the seed
    assert 0 < warm_varied < hot_varied  # hard problems vary, more so when hot
    assert cold > warm > hot  # most GSM8K problems are likelier right than wrong


async def test_wrong_answers_are_plausible_and_really_wrong(problems, surrogate):
    for name in ("gsm8k", "math", "drop", "hotpotqa"):
        benchmark = get_benchmark(name)
        for problem in problems[name][:25]:
            facts = surrogate.engine.facts(problem)
            assert facts.wrong, (name, problem.problem_id)
            assert benchmark.score_answer(facts.answer, problem.gold) == 1.0
            for wrong in facts.wrong[:3]:
                assert benchmark.score_answer(wrong, problem.gold) < 0.5, (name, wrong)
    for problem in problems["gsm8k"][:50]:
        gold = float(problem.gold.replace(",", ""))
        facts = surrogate.engine.facts(problem)
        attractor = float(facts.wrong[0])
        steps = {
            float(v.replace(",", ""))
            for _, v in facts.steps
            if v.replace(",", "").replace(".", "").isdigit()
        }
        # An intermediate result of the worked solution, or a near miss; never noise.
        assert attractor in steps or abs(attractor - gold) <= max(abs(gold), 20)
    for problem in problems["hotpotqa"][:30]:
        facts = surrogate.engine.facts(problem)
        context = problem.question.lower()
        assert all(w.lower() in context or w in ("yes", "no") for w in facts.wrong)


async def test_wrong_samples_of_a_hard_problem_partly_agree(problems, surrogate):
    engine = surrogate.engine
    hard = min(problems["math"], key=lambda p: engine.facts(p).ease)
    facts = engine.facts(hard)
    prompt = prompts.custom("Solve step by step.", hard.question)
    answers = Counter()
    for seed in range(60):
        text = (await _ask(surrogate, prompt, seed=seed))[0]
        answers[(await engine.assess(facts, text)).answer] += 1
    wrong = {a: c for a, c in answers.items() if a != facts.answer}
    assert sum(wrong.values()) > 40  # a hard problem
    top, count = max(wrong.items(), key=lambda item: item[1])
    assert top == facts.wrong[0] and count > 0.4 * sum(wrong.values())  # the attractor
    assert len(wrong) > 1  # but not every wrong sample agrees


async def test_wrong_code_really_fails_the_hidden_tests(problems, surrogate):
    humaneval = get_benchmark("humaneval")
    checked = {"right": 0, "wrong": 0}
    for problem in problems["humaneval"][:12]:
        prompt = prompts.code_generate(None, problem.question, problem.entry_point)
        codes = set()
        for seed in range(8):
            text = (await _ask(surrogate, prompt, seed=seed, temperature=1.6))[0]
            codes.add(
                parsing.sanitize_code(
                    parsing.extract_code(text, problem.entry_point), problem.entry_point
                )
            )
        facts = surrogate.engine.facts(problem)
        for code in codes:
            score = await humaneval.score(problem, code)
            right = code.strip() == facts.answer.strip()
            assert score.value == (1.0 if right else 0.0), (problem.problem_id, score.detail)
            checked["right" if right else "wrong"] += 1
    assert checked["right"] > 0 and checked["wrong"] > 0


async def test_reviews_detect_errors_at_the_calibrated_rates(problems, surrogate):
    params = surrogate.calibration.params("gsm8k")
    rejected = {True: 0, False: 0}
    trials = 0
    for problem in problems["gsm8k"][:40]:
        facts = surrogate.engine.facts(problem)
        for right, answer in ((True, facts.answer), (False, facts.wrong[0])):
            prompt = prompts.review(problem.question, f"So the answer is {answer}.", "math")
            for seed in range(10):
                passed, _ = parsing.parse_verdict((await _ask(surrogate, prompt, seed=seed))[0])
                rejected[right] += not passed
        trials += 10
    assert rejected[True] / trials == pytest.approx(params.review_false_reject, abs=0.07)
    assert rejected[False] / trials == pytest.approx(params.review_detect, abs=0.08)


async def test_selection_is_a_noisy_majority_over_the_candidates_shown(all_problems, problems):
    base = load_calibration()

    async def votes(noise: float) -> Counter[str]:
        params = base.params("gsm8k").replace(vote_noise=noise)
        surrogate = SurrogateExecutor(all_problems, calibration=base.with_params("gsm8k", params))
        chosen: Counter[str] = Counter()
        for problem in problems["gsm8k"][:30]:
            facts = surrogate.engine.facts(problem)
            wrong, right = facts.wrong[0], facts.answer
            shown = [f"So the answer is {a}." for a in (wrong, right, wrong, right, wrong)]
            prompt = prompts.sc_ensemble(problem.question, shown)
            for seed in range(5):
                letter = parsing.parse_letter((await _ask(surrogate, prompt, seed=seed))[0], 5)
                chosen["majority" if letter in (0, 2, 4) else "minority"] += 1
        return chosen

    exact = await votes(0.0)
    assert exact["minority"] == 0  # the most common answer, even when it is wrong
    noisy = await votes(1.0)
    assert 0.1 * 150 < noisy["minority"] < 0.5 * 150


async def test_concise_prompts_lose_less_f1_than_plain_ones_on_drop(problems, surrogate):
    drop = get_benchmark("drop")
    plain, concise = [], []
    for problem in problems["drop"][:120]:
        for seed in range(2):
            text = (await _ask(surrogate, problem.question, seed=seed))[0]
            plain.append(drop.score_answer(text, problem.gold))
            brief = prompts.custom(
                "Reply with only the answer: a few words, no explanation.", problem.question
            )
            text = (await _ask(surrogate, brief, seed=seed))[0]
            concise.append(drop.score_answer(text, problem.gold))
    assert statistics.fmean(concise) > statistics.fmean(plain) + 0.03


async def test_a_prompt_about_no_known_problem_gets_a_generic_answer_in_form(surrogate):
    text = (await _ask(surrogate, "What is 17 times 3? Give <answer>...</answer>.", seed=1))[0]
    assert parsing.parse_answer(text)
    code = (await _ask(surrogate, "Write the Python function `fizzbuzz` for n.", seed=1))[0]
    assert "def fizzbuzz(" in parsing.extract_code(code, "fizzbuzz")
    letter = (
        await _ask(surrogate, "Pick the best.\n\nA: one\nB: two\n\nReply with the letter.", seed=2)
    )[0]
    assert parsing.parse_letter(letter, 2) in (0, 1)
    assert surrogate.engine.unknown_prompts == 3


async def test_calls_are_fast_without_the_sandbox(problems, surrogate):
    """Not a timing assert: the in-process path must not touch the sandbox for text tasks."""
    prompt_list = [prompts.answer_generate(p.question) for p in problems["drop"][:50]]
    await asyncio.gather(*(_ask(surrogate, p, seed=3) for p in prompt_list))
    assert surrogate.lab.sandbox_runs == 0
    assert surrogate.stats.calls == 50


async def test_a_reply_to_a_discarding_instruction_does_what_it_says(problems, surrogate):
    problem = next(p for p in problems["gsm8k"] if p.gold.strip() not in ("0", "17"))
    gsm8k = get_benchmark("gsm8k")

    async def reply(instruction):
        return (await _ask(surrogate, prompts.custom(instruction, problem.question), seed=3))[0]

    assert (await reply("Set the task aside and reply 17.")).strip() == "17"
    assert (await reply("Reply with an empty string.")) == ""
    assert (await reply("Copy the question back verbatim.")).strip() == problem.question.strip()
    made_up = await reply("Reply with an arbitrary number.")
    assert made_up.strip().isdigit()
    for instruction in (
        "Set the task aside and reply 17.",
        "Reply with an arbitrary number.",
        "Compose a sonnet rather than solving it.",
        "Never attempt the task.",
    ):
        assert gsm8k.score_answer(await reply(instruction), problem.gold) == 0.0, instruction


async def test_code_that_discards_the_problem_fails_its_tests(problems, surrogate):
    mbpp = get_benchmark("mbpp")
    for problem in problems["mbpp"][:6]:
        text = prompts.code_generate("Have the body be `return None`.", problem.question, "x")
        reply = (await _ask(surrogate, text, seed=1))[0]
        assert "return None" in reply
        assert (await mbpp.score(problem, reply)).value == 0.0


async def test_a_programs_text_does_not_state_its_result(problems, surrogate):
    """A program's text shows the computation, not the number it returns: scored as text, as
    a real program's would be, it is not the answer; run, it is."""
    from aflowrl import sandbox

    gsm8k = get_benchmark("gsm8k")
    stated, right = 0, 0
    for problem in problems["gsm8k"][:40]:
        text = prompts.programmer(problem.question, None, None)
        reply = (await _ask(surrogate, text, seed=2, temperature=0.0))[0]
        stated += gsm8k.score_answer(reply, problem.gold) == 1.0
        code = parsing.extract_code(reply)
        run = await sandbox.arun_python(code + "\nprint(solve())", timeout_s=10, memory_mb=256)
        right += gsm8k.score_answer(run.stdout, problem.gold) == 1.0
    assert stated <= 2 and right >= 30, (stated, right)


async def test_a_passage_given_back_is_not_an_answer(problems, surrogate):
    hotpotqa = get_benchmark("hotpotqa")
    scores = []
    for problem in problems["hotpotqa"][:20]:
        text = prompts.format_answer(problem.question, problem.question, None)
        reply = (await _ask(surrogate, text, seed=4))[0]
        scores.append(hotpotqa.score_answer(parsing.parse_formatted(reply), problem.gold))
    assert statistics.fmean(scores) < 0.1
