"""Pictures of a run, drawn with matplotlib (Agg): the curves (``curves.png``) and a search tree.

**Curves** (:func:`curves_png`), panels over iterations, two per row:

- *Episode return*: the mean with a band of one standard deviation
  (``charts/episode_return``, ``_std``); a run on several benchmarks adds each benchmark's mean
  (``charts/episode_return/<benchmark>``) as a thin line;
- *Validation score*: the best of the iteration and of the run so far
  (``charts/iteration_best_score``, ``charts/best_score``) and the seed workflow's
  (``charts/seed_score``);
- the update diagnostics, each panel drawn when the records have one of its keys: *KL*
  (``losses/kl``, ``charts/approx_kl``, ``policy/update_kl``, ``policy/start_kl``), *Total
  variation* (``policy/update_tv``, ``policy/start_tv``), *Clip fraction* (``charts/clipfrac``,
  ``charts/clipfrac_lower``, ``charts/candidate_clipfrac``), *Entropy*, *Gradient norm*,
  *Advantages*, *Actions* (valid and duplicate ratios) and *Seconds per iteration*.

Every axis fits its data with a small margin (:func:`axis_limits`), so a gain of 0.02 in score
is visible. **Trees** (:func:`tree_png`): one record of ``trees.jsonl``
(:mod:`aflowrl.trainer.trees`) drawn top-down, nodes coloured by score. Called by
:meth:`aflowrl.trainer.records.RunDirectory.plot_curves` and ``aflowrl plot``.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

MARGIN = 0.08
"""Share of the data's range added above and below it on an axis."""

FLAT_MARGIN = 0.05
"""Half-height of the axis around a flat line: this share of its value (or this, at 0)."""

Panel = tuple[str, tuple[tuple[str, str], ...]]

DIAGNOSTICS: tuple[Panel, ...] = (
    (
        "KL",
        (
            ("losses/kl", "KL to reference (loss)"),
            ("charts/approx_kl", "approx KL (pi_old || pi)"),
            ("policy/update_kl", "KL of the update"),
            ("policy/start_kl", "KL to the start policy"),
        ),
    ),
    (
        "Total variation",
        (("policy/update_tv", "TV of the update"), ("policy/start_tv", "TV to the start policy")),
    ),
    (
        "Clip fraction",
        (
            ("charts/clipfrac", "clipped (upper)"),
            ("charts/clipfrac_lower", "clipped (lower)"),
            ("charts/candidate_clipfrac", "candidates clipped"),
        ),
    ),
    ("Entropy", (("losses/entropy", "entropy (loss)"), ("policy/entropy", "over candidates"))),
    ("Gradient norm", (("charts/grad_norm", "grad norm"),)),
    (
        "Advantages",
        (
            ("charts/advantage_std", "std"),
            ("charts/advantage_abs_mean", "mean |A|"),
            ("charts/candidate_advantage_std", "candidates std"),
        ),
    ),
    (
        "Actions",
        (
            ("charts/valid_action_ratio", "valid"),
            ("charts/duplicate_ratio", "duplicate"),
        ),
    ),
    ("Seconds per iteration", (("time/iteration", "iteration"), ("time/step", "env steps"))),
)
"""Panels after return and score: (title, ((key, label), ...))."""


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(float(value))
        ):
            xs.append(int(record["iteration"]))
            ys.append(float(value))
    return xs, ys


def axis_limits(values: Sequence[float]) -> tuple[float, float]:
    """Limits of an axis that fit ``values`` with a margin (:data:`MARGIN` of their range; a
    flat line gets :data:`FLAT_MARGIN` of its value around it)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    span = high - low
    if span <= 1e-12 * max(1.0, abs(high)):
        pad = FLAT_MARGIN * abs(high) if high != 0 else FLAT_MARGIN
        return low - pad, high + pad
    return low - MARGIN * span, high + MARGIN * span


def _legend(ax: Any) -> None:
    """A legend, when the panel has a labelled line (matplotlib warns otherwise)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=7)


def _figure(rows: int, *, width: float = 10.0, row_height: float = 3.0, dpi: int = 100) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, row_height * rows), dpi=dpi)


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def curves_figure(records: Sequence[Mapping[str, Any]], *, dpi: int = 100) -> Any:
    """The matplotlib figure of the curves (module docstring)."""
    panels = [
        (title, lines)
        for title, lines in DIAGNOSTICS
        if any(_series(records, key)[1] for key, _ in lines)
    ]
    count = 2 + len(panels)
    rows = (count + 1) // 2
    figure = _figure(rows, dpi=dpi)
    axes = list(figure.subplots(rows, 2, squeeze=False).flat)
    _return_panel(axes[0], records)
    _score_panel(axes[1], records)
    for ax, (title, lines) in zip(axes[2:], panels, strict=False):
        shown: list[float] = []
        for i, (key, label) in enumerate(lines):
            xs, ys = _series(records, key)
            if ys:
                ax.plot(xs, ys, color=f"C{i}", marker="o", markersize=2.5, label=label)
                shown += ys
        ax.set_ylim(*axis_limits(shown))
        ax.set_title(title)
        _legend(ax)
    for ax in axes[count:]:
        ax.set_visible(False)
    from matplotlib.ticker import MaxNLocator

    for ax in axes[:count]:
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole
        ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def _return_panel(ax: Any, records: Sequence[Mapping[str, Any]]) -> None:
    xs, mean = _series(records, "charts/episode_return")
    _, spread = _series(records, "charts/episode_return_std")
    shown = [0.0, *mean]
    ax.plot(xs, mean, color="#2563eb", marker="o", markersize=3, label="mean return")
    if len(spread) == len(mean) and mean:
        low = [m - s for m, s in zip(mean, spread, strict=True)]
        high = [m + s for m, s in zip(mean, spread, strict=True)]
        ax.fill_between(xs, low, high, color="#2563eb", alpha=0.15, label="± 1 std")
        shown += low + high
    prefix = "charts/episode_return/"
    benchmarks = sorted({k[len(prefix) :] for r in records for k in r if k.startswith(prefix)})
    for i, name in enumerate(benchmarks, 1):  # colour C0 is near the mean's blue
        bx, by = _series(records, prefix + name)
        ax.plot(bx, by, color=f"C{i}", linewidth=0.8, alpha=0.8, label=name)
        shown += by
    ax.axhline(0.0, color="#9ca3af", linewidth=0.8)
    ax.set_ylim(*axis_limits(shown))
    ax.set_title("Episode return")
    _legend(ax)


def _score_panel(ax: Any, records: Sequence[Mapping[str, Any]]) -> None:
    shown: list[float] = []
    for key, label, color in (
        ("charts/best_score", "best so far", "#16a34a"),
        ("charts/iteration_best_score", "best this iteration", "#f59e0b"),
        ("charts/seed_score", "seed workflow", "#6b7280"),
    ):
        xs, ys = _series(records, key)
        if ys:
            style = "--" if key == "charts/seed_score" else "-"
            ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=label)
            shown += ys
    ax.set_ylim(*axis_limits(shown))
    ax.set_title("Validation score")
    _legend(ax)


def curves_png(records: Sequence[Mapping[str, Any]], *, dpi: int = 100) -> bytes:
    """PNG bytes of the curves (module docstring)."""
    return _png(curves_figure(records, dpi=dpi))


# ---- search trees -------------------------------------------------------------------------------


def tree_layout(tree: Mapping[str, Any]) -> dict[str, tuple[float, int]]:
    """Position (x, depth) of every node: depth = steps from the root along the first edge
    that reached it, leaves spread evenly and parents centred over their children."""
    children: dict[str, list[str]] = {}
    depth = {str(tree["root"]): 0}
    for edge in tree["edges"]:
        parent, child = str(edge["parent"]), str(edge["child"])
        if child and child not in depth and parent in depth:
            depth[child] = depth[parent] + 1
            children.setdefault(parent, []).append(child)
    for node in tree["nodes"]:  # nodes no edge reaches (a malformed record): under the root
        if node not in depth:
            depth[node] = 1
            children.setdefault(str(tree["root"]), []).append(node)
    x: dict[str, float] = {}
    next_leaf = [0.0]

    def place(node: str) -> float:
        kids = children.get(node, [])
        if not kids:
            x[node] = next_leaf[0]
            next_leaf[0] += 1.0
        else:
            spots = [place(kid) for kid in kids]
            x[node] = (spots[0] + spots[-1]) / 2
        return x[node]

    place(str(tree["root"]))
    return {node: (x[node], depth[node]) for node in x}


def tree_png(tree: Mapping[str, Any], *, dpi: int = 100) -> bytes:
    """PNG bytes of one search tree (module docstring)."""
    from matplotlib import colormaps

    position = tree_layout(tree)
    scores = {str(k): float(v) for k, v in tree["nodes"].items()}
    width = max(x for x, _ in position.values()) + 1
    levels = max(d for _, d in position.values()) + 1
    figure = _figure(1, width=min(4.0 + 2.2 * width, 40.0), row_height=1.2 + 1.8 * levels, dpi=dpi)
    ax = figure.subplots()
    low, high = axis_limits(list(scores.values()))
    cmap = colormaps["viridis"]
    invalid = 0
    for edge in tree["edges"]:
        parent, child = str(edge["parent"]), str(edge["child"])
        if parent not in position:
            continue
        px, pd = position[parent]
        label = textwrap.fill(textwrap.shorten(str(edge["action"]), 56, placeholder="…"), 28)
        if not child or child not in position:
            invalid += 1
            continue
        cx, cd = position[child]
        step = edge.get("step", "")
        if edge.get("duplicate"):  # back to a node the tree held: a dotted curve, a grey label
            ax.annotate(
                "",
                xy=(cx + 0.12, -cd),
                xytext=(px + 0.12, -pd),
                arrowprops={
                    "arrowstyle": "->",
                    "linestyle": ":",
                    "color": "#9ca3af",
                    "connectionstyle": "arc3,rad=-0.45",
                },
            )
            ax.text(
                max(px, cx) + 0.45,
                -(pd + cd) / 2,
                f"{step}: {label}\n(duplicate)",
                fontsize=6,
                color="#6b7280",
                ha="left",
                va="center",
            )
            continue
        ax.annotate(
            "",
            xy=(cx, -cd + 0.18),
            xytext=(px, -pd - 0.18),
            arrowprops={"arrowstyle": "->", "color": "#4b5563"},
        )
        ax.text(
            px + 0.55 * (cx - px),
            -pd - 0.55 * (cd - pd),
            f"{step}: {label}",
            fontsize=6.5,
            ha="center",
            va="center",
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
        )
    for node, (x, d) in position.items():
        score = scores.get(node, math.nan)
        shade = (score - low) / (high - low) if high > low and math.isfinite(score) else 0.5
        root = node == str(tree["root"])
        ax.text(
            x,
            -d,
            f"{'seed ' if root else ''}{node[:8]}\n{score:.3f}",
            fontsize=8,
            ha="center",
            va="center",
            color="white" if shade < 0.6 else "black",
            bbox={
                "boxstyle": "round,pad=0.4",
                "fc": cmap(0.15 + 0.75 * shade),
                "ec": "#111827" if root else "none",
            },
        )
    curved = any(e.get("duplicate") and e.get("child") for e in tree["edges"])
    ax.set_xlim(-0.8, width - 0.2 + (0.8 if curved else 0.0))  # room for the curves' labels
    ax.set_ylim(-levels + 0.4, 0.6)
    ax.axis("off")
    title = f"Search tree: iteration {tree.get('iteration', '?')}, episode {tree.get('episode')}"
    if tree.get("benchmark"):
        title += f" ({tree['benchmark']})"
    if invalid:
        title += f"; {invalid} invalid action{'s' if invalid > 1 else ''} (no child, not drawn)"
    ax.set_title(title, fontsize=9)
    figure.tight_layout()
    return _png(figure)
