"""Options of ``rayfed run vfl-primitives``: the task, and the options of its family."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rayfed.config import DataConfig, option
from rayfed.errors import ConfigError
from rayfed.privacy import check_budget
from rayfed.privacy.calibration import MAX_DELTA, MAX_DELTA_WHY
from rayfed.protocols.base import check_party_split

TASKS = ("l1-moment", "lp-moment", "l2-moment", "kmeans", "kmedian", "lowrank", "regression")
MOMENT_TASKS = ("l1-moment", "lp-moment", "l2-moment")
CLUSTER_TASKS = ("kmeans", "kmedian")
SKETCH_TASKS = ("l2-moment", "lowrank", "regression")  # release a noisy Gaussian sketch (E.3)
PATTERN_TASKS = ("lp-moment", *CLUSTER_TASKS)  # count patterns (Alg. 1)
#: the tasks whose paper calibration is for event-level or ν-bounded neighbours (spec §1.2): they
#: run user-level by default (declared bounds, clipped) or, with neighbours=paper, as the paper
NEIGHBOUR_TASKS = (*MOMENT_TASKS, "lowrank", "regression")
#: user-level value bounds [lo, hi] per moment task (l1/lp: the synthetic generator's largest
#: value, 400; l2: ±4 standard deviations of its N(0, 1) values)
DEFAULT_VALUE_BOUNDS = {"l1-moment": (0, 400), "lp-moment": (0, 400), "l2-moment": (-4.0, 4.0)}
DEFAULT_LABEL_BOUNDS = (-1.0, 1.0)
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
        above=0,
        at_most=MAX_DELTA,
        why=MAX_DELTA_WHY,
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
        1.0, "C of the sketch size", above=0, size=True, when={"task": SKETCH_TASKS}
    )
    sketch_size: int | None = option(
        None, "s, overriding C and α", at_least=1, size=True, when={"task": SKETCH_TASKS}
    )
    neighbours: Literal["user", "paper"] = option(
        "user",
        "what the guarantee protects: user (one user's data replaced anywhere in the declared "
        "bounds, clipped to them: value_bounds, row_radius, label_bounds) or paper (the paper's "
        "weaker neighbours, NOT user-level: one entry moves by at most 1 (l1/lp-moment) or one "
        "row / value / label by at most ν (sketch tasks))",
        when={"task": NEIGHBOUR_TASKS},
    )
    value_bounds: list[float] | None = option(
        None,
        "user-level moment tasks: every value x^(j)_i in [lo, hi] (l1/lp: integers, lo >= 0; "
        "default [0, 400]; l2: default [-4, 4]); values outside: out_of_domain",
        when={"task": MOMENT_TASKS, "neighbours": ("user",)},
    )
    row_radius: float = option(
        1.0,
        "user-level lowrank/regression: each server's part of a user's row has ‖A^(j)[i]‖₂ <= C "
        "(C = row_radius); rows outside: out_of_domain",
        above=0,
        when={"task": ("lowrank", "regression"), "neighbours": ("user",)},
    )
    label_bounds: list[float] | None = option(
        None,
        "user-level regression: every label b_i in [lo, hi] (default [-1, 1]); labels outside: "
        "out_of_domain",
        when={"task": ("regression",), "neighbours": ("user",)},
    )
    out_of_domain: Literal["clip", "refuse"] = option(
        "clip",
        "user-level: data outside the declared bounds is clipped into them (counted in the "
        "headline and metrics) or refused (a DataError naming the column)",
        when={"task": NEIGHBOUR_TASKS, "neighbours": ("user",)},
    )
    nu: float = option(
        1.0,
        "neighbours=paper, sketch tasks: ν, how far the paper lets one user's row (or value, or "
        "label) move (ℓ₂)",
        above=0,
        when={"task": SKETCH_TASKS, "neighbours": ("paper",)},
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
        for name in ("value_bounds", "label_bounds"):
            _check_bounds(
                name,
                getattr(self, name),
                integers=name == "value_bounds" and self.task in ("l1-moment", "lp-moment"),
            )
        if self.baseline == "central" and self.sample_rate != 1.0:
            raise ConfigError(
                "sample_rate",
                "the central baseline counts every user's labels (no randomized response)",
                "sample_rate=1, or baseline=none",
            )

    def user_level(self) -> bool:
        """True where the guarantee is user-level: every task but the paper's neighbours."""
        return self.task not in NEIGHBOUR_TASKS or self.neighbours == "user"


def _check_bounds(name: str, bounds: list[float] | None, *, integers: bool) -> None:
    """[lo, hi] with lo < hi, finite (integers >= 0 for the counts of l1/lp-moment)."""
    if bounds is None:
        return
    if len(bounds) != 2 or not all(math.isfinite(b) for b in bounds) or not bounds[0] < bounds[1]:
        raise ConfigError(name, f"must be [lo, hi] with finite lo < hi, got {bounds}")
    if integers and (bounds[0] < 0 or any(b != round(b) for b in bounds)):
        raise ConfigError(
            name,
            f"the moment tasks count non-negative integers: got {bounds}",
            "integer bounds with lo >= 0, e.g. [0, 400]",
        )
