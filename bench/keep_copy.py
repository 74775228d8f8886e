"""``keepWeightsOnLoad``'s host copy per update: a fresh copy (before) against the copy kept once
per served version into reused buffers (after), in the same process.

Before, every update copied the worker's whole state dict into newly allocated host memory after
the manifest, on the update's critical path. Now (:func:`aflowrl.rollout.vllm_model.keep_weights`)
the copy goes into the buffers of the previous one (pinned on CUDA), and is skipped while the
served weights are unchanged (the update before was refused or put back). Timed on a model of
``--mb`` MB of float32 linear layers, on CUDA when there is one (the copy is then device to host),
``--rounds`` times each, alternating; prints the medians and the ratios.

    python bench/keep_copy.py [--mb 512] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aflowrl.rollout.vllm_model import keep_weights


def _model(megabytes: int, device: torch.device) -> torch.nn.Module:
    side = 2048
    layers = max(1, megabytes * 1024 * 1024 // (4 * side * side))
    return torch.nn.Sequential(
        *(torch.nn.Linear(side, side, bias=False) for _ in range(layers))
    ).to(device)


def _timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = _model(args.mb, device)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kept = keep_weights(model)
    assert kept is not None
    fresh, reused, unchanged = [], [], []
    for _ in range(args.rounds):
        fresh.append(_timed(lambda: keep_weights(model)))  # before: a new copy every update
        kept.current = False  # an update changed the served weights: copy into the buffers

        reused.append(_timed(lambda: keep_weights(model, kept)))
        unchanged.append(_timed(lambda: keep_weights(model, kept)))  # same version: no copy
    before, after, same = (statistics.median(x) for x in (fresh, reused, unchanged))
    print(f"device {device}, {nbytes / 1e6:.0f} MB of weights, {args.rounds} rounds (medians)")
    print(f"before  fresh copy per update:        {before * 1e3:8.1f} ms")
    print(f"after   new version, reused buffers:  {after * 1e3:8.1f} ms  ({before / after:.2f}x)")
    print(f"after   same version (no copy):       {same * 1e3:8.3f} ms  ({before / same:.0f}x)")


if __name__ == "__main__":
    main()
