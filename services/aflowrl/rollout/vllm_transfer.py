"""The nccl transport's receiving end as a vLLM weight-transfer engine (backend ``aflowrl``).

vLLM 0.32 receives trainer weights through a *weight-transfer engine* on every worker, built
from the engine's ``weight_transfer_config`` (``WeightTransferEngineFactory``) and driven by
the worker's four calls, which the rollout's :class:`~aflowrl.rollout.vllm_engine.VllmEngine`
reaches through ``collective_rpc`` as vLLM's own ``AsyncLLM`` does:
``init_weight_transfer_engine`` (join the trainer's group), ``start_weight_update``,
``update_weights`` (receive and load), ``finish_weight_update`` (finalize), and
``shutdown_weight_transfer_engine`` (leave). The worker tracks the session (a second start
before a finish is refused) and resets LoRA state after a finish; the model's weights are loaded
the way vLLM's ``nccl`` engine loads them: ``model.load_weights`` under vLLM's layer-wise reload
(``initialize_layerwise_reload`` before the first tensor, ``finalize_layerwise_reload`` at the
finish, which restores the layers that got nothing).

vLLM's ``nccl`` engine has no deadline and no abort (a ``PyNcclCommunicator`` over its own
``StatelessProcessGroup``: a lost trainer leaves the worker blocked in a collective for good),
so this backend replaces its communicator with the project's abortable weight group
(:class:`aflowrl.models.broadcast.WeightGroup`: one per replica, NCCL on CUDA, gloo on CPU,
every collective waited for with a deadline that aborts the communicator) and its stream with
:func:`aflowrl.models.broadcast.receive_weights` (header, manifest, buckets packed as vLLM's
``packed_nccl_broadcast_producer`` packs, trailer: what the learner's sender speaks). Bridged
where vLLM's API has no place for it:

* **Outcome.** ``update_weights`` and ``finish_weight_update`` return nothing, and an exception
  out of ``update_weights`` ends vLLM's session without a finish (layers left in loading mode).
  So this engine never raises out of a session: it records the outcome (ok, refused, stale,
  broken, and whether the old weights are intact), which the worker extension's
  ``aflowrl_receive_weights`` (vLLM's start, update and finish on the worker) returns.
* **Nothing touched before the manifest is checked.** The layer-wise reload starts when the
  broadcast's manifest has been accepted (version, names, shapes), not at
  ``start_weight_update``: a refused broadcast is drained without touching the model.
* **keepWeightsOnLoad.** With ``keep`` the served weights are copied to host memory before the
  reload starts and held past the finish: the rollout then puts them back on every worker if
  any worker's update failed (:meth:`AflowrlWeightTransferEngine.settle`; the replica serves
  the old version, its label unchanged), or drops them.
* **The finish never raises** either: vLLM's worker ends its session only when the engine's
  finish returns (one that raised would refuse every later start and leave), so a failed
  finalize is recorded as a broken update with the old weights not intact.
* **LoRA adapters** are not a weight update of the model (vLLM's finish would drop every loaded
  adapter): :meth:`receive_adapters` takes them over the same group and writes them as a PEFT
  adapter file, which the rollout registers through vLLM's LoRA API.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from aflowrl.errors import InvalidInputError
from aflowrl.models import broadcast
from aflowrl.models.errors import (
    BroadcastBrokenError,
    NonFiniteWeightsError,
    StaleWeightsError,
)
from aflowrl.rollout import vllm_model

logger = logging.getLogger(__name__)


@dataclass
class AflowrlTransferInitInfo(WeightTransferInitInfo):  # type: ignore[misc]  # vLLM: untyped
    """Where and as whom to join the replica's weight group (vLLM's nccl init info's fields,
    plus the group's name and deadline)."""

    master_address: str
    master_port: int
    group: str
    rank_offset: int
    """The rank of this replica's first worker (the learner is rank 0)."""
    world_size: int
    timeout_s: float


@dataclass
class AflowrlTransferUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc]
    """What one update accepts: the announced version, the floor of acceptable versions, and the
    parameters (names and shapes) the broadcast's manifest must name."""

    version: int
    serving_version: int
    names: list[str]
    shapes: list[list[int]]
    keep: bool = False
    """Put the served weights back if the load fails midway (``rollout.vllm.keepWeightsOnLoad``)."""

    def expectation(self) -> broadcast.Expectation:
        shapes = {
            str(n): tuple(int(x) for x in s) for n, s in zip(self.names, self.shapes, strict=True)
        }
        return broadcast.Expectation(int(self.version), int(self.serving_version), shapes)


class AflowrlWeightTransferEngine(
    WeightTransferEngine[AflowrlTransferInitInfo, AflowrlTransferUpdateInfo]  # type: ignore[misc]
):
    """vLLM's weight-transfer engine over the project's abortable weight group (module
    docstring)."""

    init_info_cls = AflowrlTransferInitInfo
    update_info_cls = AflowrlTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: broadcast.WeightGroup | None = None
        self._reloading = False
        """The layer-wise reload is under way (started once the manifest was accepted)."""
        self._disturbed = False
        """A step of the layer-wise reload failed partway (its initialize or finalize): some
        layers may be neither as served nor as sent."""
        self._kept: vllm_model.KeptWeights | None = None
        """This session's hold on the kept weights (``keep``), until :meth:`settle`."""
        self._copy: vllm_model.KeptWeights | None = None
        """The kept copy's buffers across sessions (reused; not copied again while the served
        weights are unchanged)."""
        self._loaded = 0
        """Buckets handed to the model's ``load_weights`` in this session (a failing one too)."""
        self._names: set[str] = set()
        """The parameters ``load_weights`` loaded in this session (a stage's own only)."""
        self._outcome: dict[str, Any] | None = None

    # ---- the group ---------------------------------------------------------------------------

    def init_transfer_engine(self, init_info: AflowrlTransferInitInfo) -> None:
        """Join the replica's weight group (leaving any previous one) as ``rank_offset`` plus
        this worker's rank in the engine (as vLLM's nccl engine ranks its workers)."""
        self.shutdown()
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        rendezvous = broadcast.Rendezvous(
            init_info.master_address,
            int(init_info.master_port),
            init_info.group,
            int(init_info.rank_offset) + rank,
            int(init_info.world_size),
            float(init_info.timeout_s),
        )
        self.group = broadcast.WeightGroup.join(rendezvous, self._group_device())

    def _group_device(self) -> torch.device:
        device = self.device
        return device if isinstance(device, torch.device) else torch.device("cpu")

    def shutdown(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()

    # ---- one update ----------------------------------------------------------------------------

    def start_weight_update(self) -> None:
        """A new session: nothing is touched until the broadcast's manifest is accepted."""
        self._reloading = False
        self._disturbed = False
        self._kept = None
        self._loaded = 0
        self._names = set()
        self._outcome = None

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive one broadcast into the model; never raises (the outcome is recorded)."""
        try:
            info = self.parse_update_info(update_info)
            self.receive_weights(info)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as exc:  # recorded: vLLM would end the session unfinished
            # Not a transport failure the stream recovered from (a bug, a bad manifest, a
            # device fault): where the group's stream stands is unknown, so leave it.
            logger.exception("weight update failed")
            self.shutdown()
            self._outcome = {"kind": "broken", "message": f"{type(exc).__name__}: {exc}"}

    def receive_weights(self, update_info: AflowrlTransferUpdateInfo) -> None:
        group = self.group
        if group is None:
            self._outcome = {"kind": "broken", "message": "this worker is in no weight group"}
            return
        expected = update_info.expectation()
        tied = vllm_model.HEAD not in expected.shapes

        def start() -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            if update_info.keep:
                self._kept = vllm_model.keep_weights(self.model, self._copy)
                self._copy = self._kept or self._copy
            if self._copy is not None:
                self._copy.current = False  # the served weights change from here on
            # Before the call: one that fails partway has put some layers in loading mode,
            # which only the finish's finalize takes out of it.
            self._reloading = True
            self._disturbed = True
            initialize_layerwise_reload(self.model)
            self._disturbed = False

        def load(bucket: list[tuple[str, torch.Tensor]]) -> None:
            self._loaded += 1  # before: a load that raises may have written some layers
            with vllm_model.reloading():
                loaded = self.model.load_weights(vllm_model.with_head(self.model, bucket, tied))
            self._names.update(loaded or ())

        self._outcome = self._receive(group, expected, start, load)

    def _receive(
        self, group: broadcast.WeightGroup, expected: broadcast.Expectation, start: Any, load: Any
    ) -> dict[str, Any]:
        """One broadcast through :func:`broadcast.receive_weights`, as an outcome dict; a broken
        group is left (the trainer forms a new one)."""
        try:
            result = broadcast.receive_weights(
                group, accept=expected.check, start=start, load=load, finish=lambda: None
            )
        except BroadcastBrokenError as exc:
            if isinstance(exc.__cause__, NonFiniteWeightsError):
                # A bucket refused after others were loaded; the stream was read to its end, so
                # the group stands. The rollout refuses the update once the kept weights are
                # back on every worker (a broken one otherwise: the layers are a mix).
                return {"kind": "broken", "message": str(exc), "non_finite": True}
            self.shutdown()
            return {"kind": "broken", "message": str(exc)}
        except InvalidInputError as exc:
            return {"kind": "refused", "message": exc.reason, "field": exc.field}
        except StaleWeightsError as exc:
            return {"kind": "stale", "message": str(exc)}
        return {
            "kind": "ok",
            "version": result.manifest.version,
            "buckets": result.buckets,
            "bytes": result.bytes,
        }

    def finish_weight_update(self) -> None:
        """Finalize vLLM's layer-wise reload (layers that got nothing get their old tensors back)
        and record whether the served weights are as they were; never raises (vLLM's worker ends
        its session only when the finish returns). Kept weights stay kept until :meth:`settle`:
        with tensor parallelism the rollout restores every worker when any one failed."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        outcome = self._outcome or {"kind": "broken", "message": "no weights were received"}
        outcome["loaded"] = self._loaded
        outcome["stage"] = vllm_model.loaded_report(self._names)
        self._names = set()
        if self._reloading:
            self._reloading = False
            try:
                with vllm_model.reloading():
                    finalize_layerwise_reload(self.model, self.model_config)
                unfinished = vllm_model.meta_tensors(self.model)
                if unfinished:
                    raise RuntimeError(
                        f"{len(unfinished)} tensors left unloaded, e.g. {unfinished[:3]}"
                    )
            except Exception as exc:  # recorded: a raise would leave vLLM's session open
                logger.exception("finalizing the weight update failed")
                self._disturbed = True
                outcome = {
                    "kind": "broken",
                    "message": f"finalizing the update failed: {type(exc).__name__}: {exc}",
                    "loaded": self._loaded,
                    "stage": outcome.get("stage"),
                }
        # intact: a failed update left the served weights as they were (it loaded nothing and
        # every reload step it took completed); a completed one replaced them.
        outcome["intact"] = outcome["kind"] != "ok" and not self._loaded and not self._disturbed
        outcome["kept"] = self._kept is not None
        outcome["engine"] = type(self).__name__
        outcome["backend"] = str(self.config.backend)
        self._outcome = outcome

    def settle(self, restore: bool) -> bool:
        """End the session's hold on the kept weights: put them back (``restore``; True when
        they were) or drop them (False)."""
        kept, self._kept = self._kept, None
        if not restore or kept is None:
            return False
        try:
            return vllm_model.restore_weights(self.model, kept)
        except Exception:  # an answer, not a raise: the rollout reads every worker's reply
            logger.exception("putting the kept weights back failed")
            return False

    def outcome(self) -> dict[str, Any]:
        """The last session's outcome (read once, after its finish). A session vLLM ended
        without the finish (its layers still in loading mode) is finalized here and reported
        broken, never ok."""
        if self._reloading:
            self.finish_weight_update()
            unfinished = self._outcome or {}
            unfinished.update(kind="broken", intact=False)
            unfinished["message"] = f"the update was never finished: {unfinished.get('message')}"
        outcome, self._outcome = self._outcome, None
        return outcome or {"kind": "broken", "message": "no weight update was finished"}

    # ---- LoRA adapters ---------------------------------------------------------------------------

    def receive_adapters(
        self, update_info: dict[str, Any], adapter_dir: str, config_json: str, *, write: bool
    ) -> dict[str, Any]:
        """Receive a broadcast of LoRA adapters (not loaded into the model); with ``write`` (the
        first worker on each host: vLLM's ``add_lora`` makes every worker read the directory)
        write them with their config as a PEFT directory at ``adapter_dir``
        (:func:`~aflowrl.rollout.vllm_model.write_adapter`). Never raises (the rollout reads
        every worker's answer)."""
        try:
            info = self.parse_update_info(update_info)
            group = self.group
            if group is None:
                return {"kind": "broken", "message": "this worker is in no weight group"}
            adapters: dict[str, torch.Tensor] = {}

            def load(bucket: list[tuple[str, torch.Tensor]]) -> None:
                adapters.update((n, t.to("cpu", copy=True)) for n, t in bucket)

            outcome = self._receive(group, info.expectation(), lambda: None, load)
            if outcome["kind"] == "ok" and write:
                vllm_model.write_adapter(adapter_dir, config_json, adapters)
        except Exception as exc:  # an answer, not a raise; the stream position is unknown
            logger.exception("receiving adapters failed")
            self.shutdown()
            outcome = {"kind": "broken", "message": f"{type(exc).__name__}: {exc}"}
        outcome["intact"] = True
        return outcome
