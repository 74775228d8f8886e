"""The reward and best-score curves of a run (``curves.png``), drawn with matplotlib (Agg).

Two panels over iterations: the mean episode return with a band of one standard deviation
(``charts/episode_return``, ``charts/episode_return_std``), and the best validation score, of
the iteration and of the run so far (``charts/iteration_best_score``, ``charts/best_score``),
with the seed workflow's score for reference (``charts/seed_score``). A run on several
benchmarks adds each benchmark's mean return (``charts/episode_return/<benchmark>``) as a thin
line. Called by
:meth:`aflowrl.trainer.records.RunDirectory.plot_curves`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(float(value)):
            xs.append(int(record["iteration"]))
            ys.append(float(value))
    return xs, ys


def curves_png(records: Sequence[Mapping[str, Any]], *, dpi: int = 100) -> bytes:
    """PNG bytes of the two panels (module docstring)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.0, 3.6), dpi=dpi)
    reward_ax, score_ax = figure.subplots(1, 2)
    xs, mean = _series(records, "charts/episode_return")
    _, spread = _series(records, "charts/episode_return_std")
    reward_ax.plot(xs, mean, color="#2563eb", marker="o", markersize=3, label="mean return")
    if len(spread) == len(mean) and mean:
        low = [m - s for m, s in zip(mean, spread, strict=True)]
        high = [m + s for m, s in zip(mean, spread, strict=True)]
        reward_ax.fill_between(xs, low, high, color="#2563eb", alpha=0.15, label="± 1 std")
    prefix = "charts/episode_return/"
    benchmarks = sorted({k[len(prefix) :] for r in records for k in r if k.startswith(prefix)})
    for i, name in enumerate(benchmarks, 1):  # colour C0 is near the mean's blue
        bx, by = _series(records, prefix + name)
        reward_ax.plot(bx, by, color=f"C{i}", linewidth=0.8, alpha=0.8, label=name)
    reward_ax.axhline(0.0, color="#9ca3af", linewidth=0.8)
    reward_ax.set_title("Episode return")
    reward_ax.set_xlabel("iteration")
    reward_ax.legend(loc="best", fontsize=8)
    for key, label, color in (
        ("charts/best_score", "best so far", "#16a34a"),
        ("charts/iteration_best_score", "best this iteration", "#f59e0b"),
        ("charts/seed_score", "seed workflow", "#6b7280"),
    ):
        sx, sy = _series(records, key)
        if sy:
            style = "--" if key == "charts/seed_score" else "-"
            score_ax.plot(sx, sy, style, color=color, marker="o", markersize=3, label=label)
    score_ax.set_title("Validation score")
    score_ax.set_xlabel("iteration")
    score_ax.set_ylim(-0.02, 1.02)
    score_ax.legend(loc="lower right", fontsize=8)
    for axes in (reward_ax, score_ax):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
