"""The surrogate's parameters: a versioned JSON file, one block of numbers per benchmark.

The file shipped with the package (``calibration.json`` beside this module) was fitted by
``aflowrl surrogate calibrate --fit`` so the classic workflows land near the AFlow paper's
gpt-4o-mini accuracies (:mod:`aflowrl.cli.surrogate_calibration`). A run spec may name its own
file (``environment.executor.calibration``). The model that reads these numbers is
:mod:`aflowrl.executor.surrogate.model`; what each number means is documented on
:class:`BenchmarkParams`.

Format (``version`` 1)::

    {"version": 1, "name": "gpt-4o-mini", "description": "...",
     "seed": 0, "fit": {...how and on what it was fitted...},
     "benchmarks": {"gsm8k": {"base_logit": 3.1, "spread": 2.4, ...}, ...}}

A benchmark block may set any subset of the fields; the rest keep their defaults. Unknown
fields, wrong types and values out of bounds are errors naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

from aflowrl.errors import InvalidInputError

CALIBRATION_VERSION: Final = 1
"""Version of the file format this code reads and writes."""

SHIPPED: Final = "calibration.json"
"""Name of the shipped file (package data of this package)."""


@dataclass(frozen=True)
class BenchmarkParams:
    """How the surrogate behaves on one benchmark.

    Correctness of a generated answer: P(correct) = sigmoid((a + s * e_p + sum of effects) / T),
    with a = ``base_logit``, s = ``spread``, e_p the problem's latent ease (standard normal,
    fixed by the problem id and the calibration), the effects of what the prompt asks for
    (``step_by_step``, ``program``, ``answer_only``), and T the sampling temperature.
    Probabilities are plain probabilities per call.
    """

    # What a generated answer gets right.
    base_logit: float = 1.0
    """Logit of a plain answer on a problem of average ease."""
    spread: float = 2.0
    """Spread of latent ease across problems, in logits (large: problems are either easy or
    hard, so samples agree and ensembles gain little)."""
    covariate_weight: float = 0.0
    """Share of latent ease explained by an observable trait of the problem (GSM8K: number of
    steps of the reference; code: length of the reference; DROP: number or span answer;
    HotpotQA: comparison or bridge question); the rest is noise fixed by the problem id."""
    step_by_step: float = 0.0
    """Logit effect of asking for step-by-step reasoning."""
    answer_only: float = 0.0
    """Logit effect of asking for the bare answer with no reasoning (negative on math)."""
    program: float = 0.0
    """Logit effect of writing a ``solve()`` program instead of reasoning in text."""
    program_error: float = 0.15
    """Probability that a written program crashes when run."""
    program_fix: float = 0.7
    """Probability that a program rewritten after a crash runs."""
    hint_follow: float = 0.6
    """Probability that an answer shown earlier results adopts their most common answer."""
    attractor: float = 0.6
    """Share of wrong samples that give the problem's most tempting wrong answer (the rest
    spread over other plausible wrong answers): wrong samples agree, so voting cannot fix all."""

    # How QA answers are worded (token F1 punishes extra words).
    verbose_plain: float = 0.0
    """Probability that an answer to a prompt that asks for no particular form is wordy."""
    imprecise_concise: float = 0.1
    """Probability that a short answer still carries extra or missing words."""
    imprecise_extracted: float = 0.03
    """The same for an answer extracted by a dedicated formatting prompt."""

    # Code.
    visible_failure: float = 0.6
    """Probability that wrong code fails the problem's public example tests too (else it fails
    only hidden tests); chosen among mutants verified in the sandbox."""
    test_fix: float = 0.7
    """Probability that code rewritten after failed tests is right."""

    # Review and revision.
    review_false_reject: float = 0.1
    """Probability that a review calls a right solution wrong."""
    review_detect: float = 0.6
    """Probability that a review calls a wrong solution wrong."""
    revise_fix: float = 0.4
    """Probability that revising a wrong solution makes it right."""
    revise_break: float = 0.05
    """Probability that revising a right solution makes it wrong."""

    # Choosing among labelled candidates.
    vote_noise: float = 0.35
    """Noise of one selection, in candidate counts (0: an exact majority vote)."""
    judge_skill: float = 0.5
    """Bonus of right candidates when the prompt asks to judge them critically, in counts."""
    judge_bias: float = 0.5
    """Spread of a per-problem preference for some answers over others (how convincing each
    looks), in counts; the same for every vote on that problem."""

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise InvalidInputError("must be a number", field=item.name)
            if not math.isfinite(value):
                raise InvalidInputError("must be finite", field=item.name)
            low, high = param_bounds(item.name)
            if not low <= value <= high:
                raise InvalidInputError(f"{value} is not in [{low}, {high}]", field=item.name)

    def replace(self, **changes: float) -> BenchmarkParams:
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes)


_PROBABILITY = (0.0, 1.0)
_LOGIT = (-12.0, 12.0)
_BOUNDS: dict[str, tuple[float, float]] = {
    "base_logit": _LOGIT,
    "spread": (0.0, 12.0),
    "covariate_weight": (0.0, 0.95),
    "step_by_step": _LOGIT,
    "answer_only": _LOGIT,
    "program": _LOGIT,
    "vote_noise": (0.0, 10.0),
    "judge_skill": (-10.0, 10.0),
    "judge_bias": (0.0, 10.0),
}
PARAM_NAMES: Final = tuple(f.name for f in dataclasses.fields(BenchmarkParams))


def param_bounds(name: str) -> tuple[float, float]:
    """The allowed range of parameter ``name``."""
    return _BOUNDS.get(name, _PROBABILITY)


@dataclass(frozen=True)
class Calibration:
    """Every benchmark's parameters, with where they came from."""

    name: str
    """The model the surrogate imitates (e.g. ``gpt-4o-mini``)."""
    benchmarks: dict[str, BenchmarkParams]
    description: str = ""
    seed: int = 0
    """Seed of each problem's latent ease and of the order of its wrong answers (fixed while
    the numbers are fitted, so a fit does not reshuffle which problems are hard)."""
    fit: dict[str, Any] = field(default_factory=dict)
    """How the numbers were fitted (procedure, split, seeds, residuals); informational."""
    default: BenchmarkParams = field(default_factory=BenchmarkParams)
    """Parameters of benchmarks the file does not name."""

    def params(self, benchmark: str) -> BenchmarkParams:
        """The parameters of ``benchmark`` (the defaults when the file does not name it)."""
        return self.benchmarks.get(benchmark, self.default)

    def with_params(self, benchmark: str, params: BenchmarkParams) -> Calibration:
        """A copy with ``benchmark``'s parameters replaced."""
        return dataclasses.replace(self, benchmarks={**self.benchmarks, benchmark: params})

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CALIBRATION_VERSION,
            "name": self.name,
            "description": self.description,
            "seed": self.seed,
            "fit": self.fit,
            "benchmarks": {
                name: dataclasses.asdict(params) for name, params in sorted(self.benchmarks.items())
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @functools.cached_property
    def fingerprint(self) -> str:
        """Hash of the parameters and seed (not of the description or fit notes): part of the
        executor id, so evaluations cached under other parameters are not reused."""
        numbers = {
            name: dataclasses.asdict(params) for name, params in sorted(self.benchmarks.items())
        }
        text = json.dumps([self.name, self.seed, numbers], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @staticmethod
    def from_dict(doc: object, *, source: str = "calibration") -> Calibration:
        """Validate a parsed file; errors name the field (``benchmarks.gsm8k.spread``)."""
        if not isinstance(doc, dict):
            raise InvalidInputError(f"{source}: expected a JSON object", field="calibration")
        version = doc.get("version")
        if version != CALIBRATION_VERSION:
            raise InvalidInputError(
                f"{source}: version {version!r}; this aflow-rl reads version {CALIBRATION_VERSION}",
                field="version",
            )
        unknown = set(doc) - {"version", "name", "description", "seed", "fit", "benchmarks"}
        if unknown:
            raise InvalidInputError(f"{source}: unknown fields {sorted(unknown)}", field="")
        name = doc.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InvalidInputError(f"{source}: must be a non-empty string", field="name")
        blocks = doc.get("benchmarks", {})
        if not isinstance(blocks, dict):
            raise InvalidInputError(f"{source}: must be an object", field="benchmarks")
        benchmarks: dict[str, BenchmarkParams] = {}
        for bench, block in blocks.items():
            where = f"benchmarks.{bench}"
            if not isinstance(block, dict):
                raise InvalidInputError(f"{source}: must be an object", field=where)
            extra = set(block) - set(PARAM_NAMES)
            if extra:
                raise InvalidInputError(
                    f"{source}: unknown parameters {sorted(extra)}", field=f"{where}"
                )
            try:
                benchmarks[str(bench)] = BenchmarkParams(**block)
            except InvalidInputError as exc:
                raise InvalidInputError(
                    f"{source}: {exc.reason}", field=f"{where}.{exc.field}"
                ) from None
        fit = doc.get("fit", {})
        description = doc.get("description", "")
        seed = doc.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise InvalidInputError(f"{source}: must be a non-negative integer", field="seed")
        return Calibration(
            name=name.strip(),
            benchmarks=benchmarks,
            description=str(description),
            seed=seed,
            fit=dict(fit) if isinstance(fit, dict) else {},
        )


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The calibration in ``path``, or the one shipped with aflow-rl when None."""
    if path is None or str(path) == "":
        text = resources.files(__package__ or __name__).joinpath(SHIPPED).read_text("utf-8")
        source = f"shipped {SHIPPED}"
    else:
        file = Path(path).expanduser()
        if not file.is_file():
            raise InvalidInputError(f"{file} does not exist", field="calibration")
        text = file.read_text(encoding="utf-8")
        source = str(file)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"{source}: not JSON ({exc.msg} at line {exc.lineno})", field="calibration"
        ) from None
    return Calibration.from_dict(doc, source=source)
