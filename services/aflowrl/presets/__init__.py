"""Named run specs shipped with aflow-rl: ``aflowrl spec default --preset NAME`` prints one,
``aflowrl train --preset NAME`` runs one.

Each preset is a bare RunSpec document (``<name>.yaml`` in this package, comments included);
fields it leaves out take :class:`aflowrl.config.RunSpec`'s defaults, exactly as they do for a
``TrainingRun`` applied to a cluster, so a preset printed, edited and applied means the same
thing to the CLI and to the operator.

- ``default`` (:data:`DEFAULT`): the embedded default run, what ``aflowrl train`` and ``make
  demo`` run without ``-f`` (the tiny policy, the surrogate executor, HumanEval, a few minutes
  on a CPU); its comments say where its tuned settings came from.
- every other preset is the spec of the example ``manifests/examples/<name>.yaml`` of the same
  name (a test keeps the two equal).
"""

from __future__ import annotations

from importlib import resources

from aflowrl.config import RunSpec
from aflowrl.errors import InvalidInputError

__all__ = ["DEFAULT", "load", "names", "text"]

DEFAULT = "default"
"""The preset ``aflowrl train`` runs and ``aflowrl spec default`` prints without ``--preset``."""


def names() -> list[str]:
    """Every preset's name, sorted, :data:`DEFAULT` first."""
    found = sorted(
        entry.name.removesuffix(".yaml")
        for entry in resources.files(__package__).iterdir()
        if entry.name.endswith(".yaml")
    )
    return [DEFAULT, *(name for name in found if name != DEFAULT)]


def text(name: str = DEFAULT) -> str:
    """The preset's YAML as shipped (comments included); an unknown name is bad input."""
    if name not in names():
        raise InvalidInputError(
            f"no preset {name!r} (one of {', '.join(names())})", field="--preset"
        )
    return resources.files(__package__).joinpath(f"{name}.yaml").read_text("utf-8")


def load(name: str = DEFAULT) -> RunSpec:
    """The preset as a validated RunSpec."""
    return RunSpec.from_yaml(text(name), source=f"preset {name}")
