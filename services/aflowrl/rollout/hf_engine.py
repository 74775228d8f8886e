"""The ``hf`` rollout backend: a batched, KV-cached sampler over a transformers causal LM.

Runs on CPU or one GPU. One worker thread owns the model; Generate and ScoreCandidates calls
queue jobs for it, and it packs the completions of every waiting Generate job into batches of at
most ``rollout.maxBatchSize`` rows (so concurrent requests share forward passes). A batch is
left-padded, prefilled once, then decoded one token per step with a ``DynamicCache``; rows that
finish (EOS, a stop string, max tokens) are dropped from the batch and its cache, so short
completions stop costing compute. Sampling is :mod:`aflowrl.rollout.sampling` (seeded per
completion); log-probabilities follow :mod:`aflowrl.models.logprobs`.

A completion's ``token_ids`` include the EOS token or the token that completed a stop string (as
vLLM returns them: the policy did produce them, so the learner trains on them); its ``text``
excludes special tokens and everything from the stop string on.

New weights are copied into the model tensor by tensor on the worker thread, as the stream
yields them. With ``policy.lora`` the model is wrapped with the same peft adapters as the
learner's and an update carries the adapters alone. For the nccl transport the worker thread is
a member of the learner's weight group (:mod:`aflowrl.models.broadcast`) on the model's device.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from aflowrl.config.policy import LoraSpec
from aflowrl.models import broadcast, loading, logprobs
from aflowrl.models.broadcast import BroadcastResult, Expectation, Rendezvous
from aflowrl.models.errors import (
    BroadcastBrokenError,
    NonFiniteWeightsError,
    WeightLoadFailedError,
)
from aflowrl.models.weights import parameter_shapes
from aflowrl.rollout.engine import (
    CompletionResult,
    PromptResult,
    RolloutEngine,
    SamplingOptions,
    prompt_seed,
    settle_threadsafe,
)
from aflowrl.rollout.errors import BadSamplingRequestError, EngineUnavailableError
from aflowrl.rollout.sampling import completion_seed, sample_next

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Row:
    """One completion being generated."""

    prompt: list[int]
    options: SamplingOptions
    generator: torch.Generator
    out: CompletionResult = field(
        default_factory=lambda: CompletionResult([], "", [], finish_reason="length")
    )
    done: bool = False


@dataclass
class _GenerateJob:
    rows: list[_Row]
    results: list[PromptResult]
    future: asyncio.Future[list[PromptResult]]
    loop: asyncio.AbstractEventLoop


@dataclass
class _CallJob:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


def _resolve(
    job: _GenerateJob | _CallJob, result: Any = None, error: BaseException | None = None
) -> None:
    settle_threadsafe(job.future, job.loop, result, error)


class HfEngine(RolloutEngine):
    """transformers backend (see module docstring)."""

    backend = "hf"

    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str = "auto",
        max_batch_size: int = 64,
        device: torch.device | None = None,
        trust_remote_code: bool = False,
        lora: LoraSpec | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.device = device or loading.default_device()
        self.dtype = loading.resolve_dtype(dtype, self.device)
        self.max_batch_size = max_batch_size
        self._trust_remote_code = trust_remote_code
        self._jobs: queue.Queue[_GenerateJob | _CallJob | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._running = 0
        self._closed = False
        self.model: Any = None
        self.tokenizer: Any = None
        self.max_model_len = 0
        self._eos: frozenset[int] = frozenset()
        self._pad_id = 0
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._targets: dict[str, torch.Tensor] = {}
        self._lora = lora
        self._group: broadcast.WeightGroup | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._worker, name="hf-engine", daemon=True)
        self._thread.start()
        # Warm-up: one short greedy completion compiles nothing but touches every kernel once.
        prompt = self.tokenizer("warm up", add_special_tokens=False).input_ids or [self._pad_id]
        await self.generate([prompt], SamplingOptions(temperature=0.0, max_tokens=2))

    def _load(self) -> None:
        self.tokenizer = loading.load_tokenizer(
            self.model_dir, trust_remote_code=self._trust_remote_code
        )
        self.model = loading.load_causal_lm(
            self.model_dir,
            dtype=self.dtype,
            device=self.device,
            trust_remote_code=self._trust_remote_code,
        )
        self.max_model_len = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self._eos = loading.eos_token_ids(self.model_dir, self.tokenizer)
        self._pad_id = int(self.tokenizer.pad_token_id)
        if self._lora is not None:
            from peft import get_peft_model

            self.model = get_peft_model(self.model, loading.lora_config(self._lora)).eval()
            self._shapes = loading.adapter_shapes(self.model)
            self._targets = {
                loading.adapter_file_name(n): p for n, p in self.model.named_parameters()
            }
        else:
            self._shapes = parameter_shapes(self.model)
            self._targets = dict(self.model.named_parameters())
            self._targets.update(dict(self.model.named_buffers()))
        logger.info(
            "hf engine: %s on %s in %s (%d weights, max_model_len %d)",
            self.model_dir,
            self.device,
            loading.dtype_name(self.dtype),
            len(self._shapes),
            self.max_model_len,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._jobs.put(None)
            await asyncio.to_thread(self._thread.join)
        self.model = None

    # ---- the worker thread -------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            pending: list[_GenerateJob] = []
            calls: list[_CallJob] = []
            for item in [job, *self._drain()]:
                if item is None:
                    self._jobs.put(None)  # seen again after this round
                elif isinstance(item, _GenerateJob):
                    pending.append(item)
                else:
                    calls.append(item)
            for call in calls:
                self._run_call(call)
            if pending:
                self._run_generate(pending)

    def _drain(self) -> list[_GenerateJob | _CallJob | None]:
        items: list[_GenerateJob | _CallJob | None] = []
        while True:
            try:
                items.append(self._jobs.get_nowait())
            except queue.Empty:
                return items

    def _run_call(self, call: _CallJob) -> None:
        self._running += 1
        try:
            with torch.inference_mode():
                result = call.fn()
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting coroutine, which re-raises it
            _resolve(call, error=exc)
        else:
            _resolve(call, result)
        finally:
            self._running -= 1

    def _run_generate(self, jobs: list[_GenerateJob]) -> None:
        self._running += len(jobs)
        try:
            rows = [row for job in jobs for row in job.rows]
            # Similar prompt lengths share a batch: less padding.
            rows.sort(key=lambda r: len(r.prompt))
            with torch.inference_mode():
                for start in range(0, len(rows), self.max_batch_size):
                    self._decode_batch(rows[start : start + self.max_batch_size])
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting coroutines
            for job in jobs:
                _resolve(job, error=exc)
        else:
            for job in jobs:
                _resolve(job, job.results)
        finally:
            self._running -= len(jobs)

    def _decode_batch(self, rows: list[_Row]) -> None:
        from transformers import DynamicCache

        device = self.device
        width = max(len(r.prompt) for r in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
            mask[i, width - len(row.prompt) :] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        last_pos = positions[:, -1]
        active = list(range(len(rows)))
        while True:
            batch = [rows[i] for i in active]
            tokens, lps = sample_next(
                logits,
                [r.options.temperature for r in batch],
                [r.options.top_k for r in batch],
                [r.options.top_p for r in batch],
                [r.generator for r in batch],
            )
            for row, token, lp in zip(batch, tokens.tolist(), lps.tolist(), strict=True):
                self._append(row, token, lp)
            keep = [j for j, row in enumerate(batch) if not row.done]
            if not keep:
                return
            if len(keep) < len(batch):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, last_pos, tokens = mask[index], last_pos[index], tokens[index]
                active = [active[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            last_pos = last_pos + 1
            logits = self.model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=mask,
                position_ids=last_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        out, options = row.out, row.options
        out.token_ids.append(token)
        if options.logprobs:
            out.logprobs.append(logprob)
        if token in self._eos:
            out.finish_reason, row.done = "eos", True
        elif len(out.token_ids) >= options.max_tokens:
            out.finish_reason, row.done = "length", True
        if options.stop or row.done:
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        if options.stop:
            cut = min((i for s in options.stop if (i := out.text.find(s)) >= 0), default=-1)
            if cut >= 0:
                out.text, out.finish_reason, row.done = out.text[:cut], "stop", True

    # ---- the engine interface ---------------------------------------------------------------

    def _check_running(self) -> None:
        if self._thread is None or self._closed:
            raise EngineUnavailableError("the hf engine is not running")

    def _submit_call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        self._check_running()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put(_CallJob(fn, future, loop))
        return future

    async def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions
    ) -> list[PromptResult]:
        self._check_running()
        self.check_prompts(prompts, sampling)
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(62)
        results = [PromptResult(list(p)) for p in prompts]
        rows: list[_Row] = []
        for i, prompt in enumerate(prompts):
            own, place = prompt_seed(sampling, seed, i)
            for j in range(sampling.n):
                generator = torch.Generator(device=self.device)
                generator.manual_seed(completion_seed(own, place, j))
                row = _Row(list(prompt), sampling, generator)
                results[i].completions.append(row.out)
                rows.append(row)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[PromptResult]] = loop.create_future()
        self._jobs.put(_GenerateJob(rows, results, future, loop))
        return await future

    async def score(
        self, prompt: Sequence[int], candidates: Sequence[Sequence[int]], temperature: float
    ) -> list[list[float]]:
        if not prompt:
            raise BadSamplingRequestError("empty prompt", field="prompt")

        def run() -> list[list[float]]:
            return logprobs.score_branches(
                self.model,
                prompt,
                candidates,
                pad_id=self._pad_id,
                temperature=temperature,
                device=self.device,
                max_batch=self.max_batch_size,
            )

        return await self._submit_call(run)

    def parameter_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self._shapes

    def _copy(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy every tensor into its weight; a failure midway (the stream, an out-of-memory
        error) puts back the weights already overwritten, from copies kept as it goes (at most
        one model's worth, on the model's device), and raises WeightLoadFailedError(intact)."""
        targets = self._targets
        previous: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            with torch.no_grad():
                for name, tensor in tensors:
                    target = targets[name]
                    previous.append((target, target.detach().clone()))
                    target.copy_(tensor)
        except Exception as exc:
            with torch.no_grad():
                for target, old in previous:
                    target.copy_(old)
            raise WeightLoadFailedError(
                f"loading new weights failed after {len(previous)} tensors ({exc}); the old "
                "weights were put back",
                intact=True,
            ) from exc

    async def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        await self._submit_call(lambda: self._copy(tensors))
        return 1

    async def adopt_weights(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """On the CPU, point every weight at its staged tensor (no copy): a grpc update is then
        swapped in at once. Only when every tensor matches its weight in dtype and shape and is
        aligned to its element size; otherwise nothing changes and the caller copies."""
        targets = self._targets
        if self.device.type != "cpu" or set(tensors) != set(self._shapes):
            return False
        for name, tensor in tensors.items():
            target = targets.get(name)
            if (
                target is None
                or tensor.device.type != "cpu"
                or tensor.dtype != target.dtype
                or tensor.shape != target.shape
                or not tensor.is_contiguous()
                or tensor.data_ptr() % tensor.element_size()
            ):
                return False

        def adopt() -> None:
            with torch.no_grad():
                for name, tensor in tensors.items():
                    targets[name].data = tensor

        await self._submit_call(adopt)
        return True

    # ---- the nccl transport (on the worker thread, where the model lives) --------------------

    async def join_weight_group(self, rendezvous: Rendezvous) -> None:
        def join() -> None:
            self._leave()
            self._group = broadcast.WeightGroup.join(rendezvous, self.device)

        await self._submit_call(join)

    def _leave(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.close()

    async def leave_weight_group(self) -> None:
        if self._thread is not None and not self._closed:
            await self._submit_call(self._leave)

    async def receive_weights(
        self, expectation: Expectation, on_bucket: Callable[[int], None] | None = None
    ) -> BroadcastResult:
        def receive() -> BroadcastResult:
            group = self._group
            if group is None:
                raise BroadcastBrokenError("this replica is in no weight group")
            targets = self._targets
            previous: list[tuple[torch.Tensor, torch.Tensor]] = []

            def load(bucket: Iterable[tuple[str, torch.Tensor]]) -> None:
                # The old values of what each bucket overwrites, until the broadcast ends: a
                # later bucket refused (non-finite values) puts them back.
                with torch.no_grad():
                    for name, tensor in bucket:
                        target = targets[name]
                        previous.append((target, target.detach().clone()))
                        target.copy_(tensor)

            try:
                return broadcast.receive_weights(
                    group,
                    accept=expectation.check,
                    start=lambda: None,
                    load=load,
                    finish=lambda: None,
                    on_bucket=on_bucket,
                )
            except BroadcastBrokenError as exc:
                refusal = exc.__cause__
                if isinstance(refusal, NonFiniteWeightsError):
                    # Drained to its trailer (the group stands): a refusal, the old weights back.
                    with torch.no_grad():
                        for target, old in reversed(previous):
                            target.copy_(old)
                    raise NonFiniteWeightsError(
                        f"{refusal.reason}; the {len(previous)} weights already loaded were put "
                        "back",
                        field=refusal.field,
                    ) from exc
                self._leave()
                raise
            finally:
                previous.clear()

        result: BroadcastResult = await self._submit_call(receive)
        return result

    def load_stats(self) -> tuple[int, int]:
        return (self._jobs.qsize(), self._running)
