"""Pure tensor math of RL: GiGPO, GRPO, GAE, PPO loss, KL estimators (numpy or torch; no I/O).

Import the modules by name (``from aflowrl.rl import gigpo``): the advantage estimators
(:mod:`gigpo`, :mod:`grpo`, :mod:`gae`, :mod:`rewards`), :mod:`candidates` (the choice
distribution and value bins) and :mod:`kl` need only numpy, so the torch-free trainer imports
them; :mod:`ppo` and :mod:`choice` need torch (the learner's side); :mod:`yardstick` holds the
statistics of the learning benches (bootstrap SE, cross-fitted oracle, rank calibration).
Every function follows verl / verl-agent numerically and has an oracle test in tests/unit/rl/.
"""

from aflowrl.rl.errors import RLInputError

__all__ = [
    "RLInputError",
    "candidates",
    "choice",
    "gae",
    "gigpo",
    "grpo",
    "kl",
    "ppo",
    "rewards",
    "yardstick",
]
