"""Options of ``rayfed run vfl-primitives``: the task, and the options of its family."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rayfed.config import DataConfig, option
from rayfed.errors import ConfigError
from rayfed.privacy import check_budget
from rayfed.protocols.base import check_party_split

TASKS = ("l1-moment", "lp-moment", "l2-moment", "kmeans", "kmedian", "lowrank", "regression")
MOMENT_TASKS = ("l1-moment", "lp-moment", "l2-moment")
CLUSTER_TASKS = ("kmeans", "kmedian")
SKETCH_TASKS = ("l2-moment", "lowrank", "regression")  # release a noisy Gaussian sketch (E.3)
PATTERN_TASKS = ("lp-moment", *CLUSTER_TASKS)  # count patterns (Alg. 1)
BASELINES = {  # spec §4.4: baseline -> the tasks it replaces the VFL algorithm of
    "central": CLUSTER_TASKS,
    "input-perturbation": ("lowrank",),
}


@dataclass(frozen=True)
class VflPrimitivesConfig:
    """Options of ``rayfed run vfl-primitives``."""

    task: Literal[TASKS] = option("kmeans", "primitive: " + ", ".join(TASKS))
    epsilon: float = option(1.0, "privacy budget of each server (DP in VFL)", above=0)
    delta: float = option(
        1e-5,
        "δ of the Gaussian sketch tasks (l2-moment, lowrank, regression)",
        at_least=0,
        below=1,
        when={"task": SKETCH_TASKS},
    )
    parties: int = option(
        2, "number of servers v (synthetic data, or to deal a file's columns)", at_least=1
    )
    users: int = option(
        20_000, "synthetic data: number of users m", at_least=1, size=True, source="synthetic"
    )
    dims: int | None = option(
        None,
        "synthetic data: attributes d (default per task: 6/20/10; moment tasks have one per server)",
        at_least=1,
        size=True,
        source="synthetic",
        when={"task": (*CLUSTER_TASKS, "lowrank", "regression")},
    )
    k: int = option(
        4,
        "kmeans/kmedian: clusters; lowrank: rank",
        at_least=1,
        when={"task": (*CLUSTER_TASKS, "lowrank")},
    )
    p: float = option(
        2.0, "lp-moment: the power p (>= 1)", at_least=1, when={"task": ("lp-moment",)}
    )
    alpha: float = option(
        0.25,
        "accuracy α: lp-moment threshold; sketch size s = C·k/α², C·d/α², C/α²",
        above=0,
        below=1,
        when={"task": ("lp-moment", *SKETCH_TASKS)},
    )
    sketch_constant: float = option(
        1.0, "C of the sketch size", above=0, when={"task": SKETCH_TASKS}
    )
    sketch_size: int | None = option(
        None, "s, overriding C and α", at_least=1, size=True, when={"task": SKETCH_TASKS}
    )
    nu: float = option(
        1.0,
        "ν: how far one user's row (or label) may move (ℓ₂), sketch tasks",
        above=0,
        when={"task": SKETCH_TASKS},
    )
    radius: float = option(
        1.0,
        "Δ: every user's full row has ‖A[i]‖₂ <= Δ (kmeans, kmedian)",
        above=0,
        when={"task": CLUSTER_TASKS},
    )
    bound: int | None = option(
        None,
        "lp-moment: override the pattern bound M (theorem: huge)",
        at_least=1,
        when={"task": ("lp-moment",)},
    )
    counts: Literal["clipped", "raw"] = option(
        "clipped",
        "lp-moment: pattern counts max(0, ·) as Alg. 2 (clipped) or unbiased (raw)",
        when={"task": ("lp-moment",)},
    )
    interaction: Literal["interactive", "non-interactive"] = option(
        "interactive",
        "lp-moment: Alg. 2 as written (the CC sends L back before the pattern counting), or the "
        "non-interactive variant (spec §2.5; not in the paper): one round, the CC drops L itself",
        when={"task": ("lp-moment",)},
    )
    sample_rate: float = option(
        1.0,
        "kmeans/kmedian: rate p of the public sample whose labels are counted (Thm B.2); 1: all",
        above=0,
        at_most=1,
        when={"task": CLUSTER_TASKS},
    )
    baseline: Literal["none", "central", "input-perturbation"] = option(
        "none",
        "a §4.4 baseline instead of the VFL algorithm: central (kmeans/kmedian: a trusted curator "
        "releases a Laplace histogram of the labels; not DP in VFL), input-perturbation (lowrank: "
        "each server releases A^(j) + N(0, σ²))",
        when={"task": (*CLUSTER_TASKS, "lowrank")},
    )
    calibration: Literal["paper", "exact"] = option(
        "paper",
        "pattern counting: ε'=ε/16 (paper; true loss ≈ ε/2) or ε'=tanh(ε/4)/2 (exact)",
        when={"task": PATTERN_TASKS},
    )
    label: str | None = option(
        None,
        "regression on a data file: the label column",
        when={"task": ("regression",)},
        source="file",
    )
    evaluate: bool = option(True, "add errors against the non-private answer (not private)")
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, self.delta if self.task in SKETCH_TASKS else 0.0)
        if self.task in SKETCH_TASKS and self.delta <= 0:
            raise ConfigError("delta", "the Gaussian sketch needs δ > 0", "e.g. 1e-5")
        if self.task in PATTERN_TASKS and self.epsilon >= 8:
            raise ConfigError("epsilon", "pattern counting needs ε' = ε/16 < 1/2", "ε < 8")
        check_party_split(self)
        if self.baseline != "none" and self.task not in BASELINES[self.baseline]:
            raise ConfigError(
                "baseline",
                f"baseline={self.baseline} has no {self.task} version",
                f"task in {BASELINES[self.baseline]}, or baseline=none",
            )
        if self.baseline == "central" and self.calibration != "paper":
            raise ConfigError(
                "calibration",
                "the central baseline runs no randomized response to calibrate",
                "calibration=paper (the default), or baseline=none",
            )
        if self.baseline == "central" and self.sample_rate != 1.0:
            raise ConfigError(
                "sample_rate",
                "the central baseline counts every user's labels (no randomized response)",
                "sample_rate=1, or baseline=none",
            )

    def eps_prime(self, epsilon: float) -> float:
        """The randomized-response bias ε' of pattern counting at budget ``epsilon``."""
        return epsilon / 16 if self.calibration == "paper" else math.tanh(epsilon / 4) / 2
