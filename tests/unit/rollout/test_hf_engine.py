"""The hf engine against transformers' own generate, and its batching across requests."""

from __future__ import annotations

import asyncio

import pytest
import torch

from aflowrl.models import builtin
from aflowrl.rollout.engine import SamplingOptions
from aflowrl.rollout.errors import BadSamplingRequestError
from aflowrl.rollout.gate import VersionGate
from aflowrl.rollout.hf_engine import HfEngine


async def test_greedy_equals_generate_and_concurrent_requests_share_batches():
    engine = HfEngine(builtin.ensure("tiny"), max_batch_size=4)
    await engine.start()
    try:
        tokenizer = engine.tokenizer
        prompts = [tokenizer(f"Task {i}: {'x' * i}").input_ids for i in range(6)]
        results = await engine.generate(prompts, SamplingOptions(temperature=0.0, max_tokens=12))
        for prompt, result in zip(prompts, results, strict=False):
            expected = engine.model.generate(
                torch.tensor([prompt], device=engine.device),
                max_new_tokens=12,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
            completion = result.completions[0]
            if completion.finish_reason == "eos":
                expected = expected[: len(completion.token_ids)]
            assert completion.token_ids == expected

        sampled = SamplingOptions(temperature=1.0, max_tokens=16, n=2, seed=3)
        alone = await engine.generate(prompts[:2], sampled)
        together = await asyncio.gather(
            engine.generate(prompts[:2], sampled),
            engine.generate(prompts[2:], SamplingOptions(temperature=0.5, max_tokens=5)),
        )
        assert [c.token_ids for r in together[0] for c in r.completions] == [
            c.token_ids for r in alone for c in r.completions
        ]
        assert all(len(c.token_ids) <= 5 for r in together[1] for c in r.completions)
    finally:
        await engine.close()


async def test_prompt_seeds_sample_a_prompt_the_same_wherever_it_is_sent():
    """With per-prompt seeds, a prompt's completion depends on its seed alone: not on its place
    in the request nor on the other prompts (the trainer batches whatever decisions are ready)."""
    engine = HfEngine(builtin.ensure("tiny"), max_batch_size=4)
    await engine.start()
    try:
        tokenizer = engine.tokenizer
        prompts = [tokenizer(f"Task {i}: {'y' * i}").input_ids for i in range(4)]
        seeds = (11, 22, 33, 44)

        def sampled(prompt_seeds: tuple[int, ...]) -> SamplingOptions:
            return SamplingOptions(
                temperature=1.0, max_tokens=12, seed=5, prompt_seeds=prompt_seeds
            )

        def tokens(results) -> list[list[int]]:
            return [r.completions[0].token_ids for r in results]

        together = tokens(await engine.generate(prompts, sampled(seeds)))
        reordered = tokens(await engine.generate(prompts[::-1], sampled(seeds[::-1])))
        alone = [
            tokens(await engine.generate([p], sampled((s,))))[0]
            for p, s in zip(prompts, seeds, strict=True)
        ]
        assert together == reordered[::-1] == alone
        assert len({tuple(t) for t in together}) > 1  # the prompts did sample
        with pytest.raises(BadSamplingRequestError):
            await engine.generate(prompts, sampled(seeds[:1]))
    finally:
        await engine.close()


async def test_gate_holds_swaps_until_requests_finish():
    gate = VersionGate(3)
    order: list[str] = []

    async def request(name: str, delay: float) -> int:
        async with gate.serving() as version:
            await asyncio.sleep(delay)
            order.append(name)
            return version

    async def swap() -> None:
        async with gate.swapping():
            order.append("swap")
            gate.version = 4

    first = asyncio.ensure_future(request("slow", 0.05))
    await asyncio.sleep(0.01)
    swapping = asyncio.ensure_future(swap())
    await asyncio.sleep(0.01)
    late = asyncio.ensure_future(request("late", 0.0))  # waits behind the swap
    assert await first == 3 and await late == 4
    await swapping
    assert order == ["slow", "swap", "late"]


async def test_a_cpu_engine_serves_staged_weights_without_copying_them():
    """``adopt_weights``: matching tensors become the weights themselves (no copy) and greedy
    output follows them; a dtype, shape or name mismatch, or a partial set, is declined with
    nothing changed (the caller copies instead)."""
    engine = HfEngine(builtin.ensure("tiny"), max_batch_size=2, dtype="float32")
    await engine.start()
    try:
        prompt = [engine.tokenizer("Adopt the staged weights").input_ids]
        greedy = SamplingOptions(temperature=0.0, max_tokens=8)
        before = (await engine.generate(prompt, greedy))[0].completions[0].token_ids
        params = dict(engine.model.named_parameters())
        names = list(engine.parameter_shapes())
        generator = torch.Generator().manual_seed(0)
        staged = {
            n: params[n].detach() + 0.5 * torch.randn(params[n].shape, generator=generator)
            for n in names
        }
        pointers = {n: params[n].data_ptr() for n in names}

        wrong_dtype = {**staged, names[0]: staged[names[0]].to(torch.float64)}
        wrong_shape = {**staged, names[0]: staged[names[0]].reshape(-1)}
        partial = {n: staged[n] for n in names[1:]}
        for declined in (wrong_dtype, wrong_shape, partial):
            assert not await engine.adopt_weights(declined)
            assert {n: params[n].data_ptr() for n in names} == pointers
        assert (await engine.generate(prompt, greedy))[0].completions[0].token_ids == before

        assert await engine.adopt_weights(staged)
        assert all(params[n].data_ptr() == staged[n].data_ptr() for n in names)
        assert all(torch.equal(params[n], staged[n]) for n in names)
        after = (await engine.generate(prompt, greedy))[0].completions[0].token_ids
        assert after != before
    finally:
        await engine.close()
