"""Options of ``rayfed run square-wave``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rayfed.config import DataConfig, option
from rayfed.dropout import Phases, PopulationConfig
from rayfed.errors import ConfigError
from rayfed.ldp import square_wave as sw
from rayfed.ldp import wave
from rayfed.privacy import check_budget

#: SW: its transition matrix holds to here (columns sum to 1 within 1e-11 at d = 4,096)
#: a square-wave round has one phase: each user's report (population.rates/lost name it)
REPORT = Phases(("report",))
MAX_EPSILON = 100.0
MAX_EPSILON_OTHERS = 20.0  # the frequency oracles' e^ε-sized ranges (OLH's hash range) beyond
#: d and d̃: EM/EMS multiply by M through its structured O(d) product above AUTO_DENSE_BUCKETS
#: (rayfed.ldp.wave), so memory is O(n + d); 2^16 is tested end to end (benchmarks/sw_large_d.py:
#: an EMS iteration takes 29 ms there, up to 10,000 of them; and n must be far above d for the
#: reports' histogram to say anything)
MAX_BUCKETS = 65_536
#: the largest dense transition matrix (d·d̃ <= 4,096², the old cap: transition=dense gives the
#: old results bit for bit); the hierarchy methods stay there too (HH's OLH layers count support
#: in O(d·n), HH-ADMM's NNLS is dense)
DENSE_BUCKETS = 4096
#: transition=auto: dense up to d·d̃ = 2,048² (the same results bit for bit as before, and as
#: fast or faster there on an idle machine: 0.8 against 1.0 ms per EMS iteration at 2,048), the
#: structured product above (2.5x faster at 4,096, equal to rounding:
#: benchmarks/results/sw_large_d.json)
AUTO_DENSE_BUCKETS = 2048
#: trapezoid and triangle waves: their structured product loses ~1e-19·d/(b²(1 - ratio)) of
#: a column's sum (b = b_SW(ε) shrinks as e^-ε): 1e-10 at d = 2^16 and ε = 5
MAX_EPSILON_WAVES = 5.0
WAVES = ("square", "trapezoid", "triangle")
METHODS = ("sw-ems", "sw-em", "cfo", "hh", "hh-admm", "haar-hrr", "sr", "pm")
SW_METHODS = ("sw-ems", "sw-em")
MOMENT_METHODS = ("sr", "pm")
RANGE_ONLY = ("hh", "haar-hrr")  # may be negative: range queries only (spec Table 3.2)


@dataclass(frozen=True)
class SquareWaveConfig:
    """Options of ``rayfed run square-wave``."""

    method: Literal[METHODS] = option("sw-ems", "estimator: " + ", ".join(METHODS))
    epsilon: float = option(
        1.0,
        f"ε of every user's one report (ε-LDP); at most {MAX_EPSILON:g} for SW, "
        f"{MAX_EPSILON_OTHERS:g} for the other methods",
        above=0,
        at_most=MAX_EPSILON,
    )
    buckets: int = option(
        256,
        f"d, buckets of the estimated histogram of [0, 1] (at most {MAX_BUCKETS:,}; "
        f"{DENSE_BUCKETS:,} for hh and hh-admm)",
        at_least=2,
        at_most=MAX_BUCKETS,
    )
    output_buckets: int | None = option(
        None,
        "SW: d̃, buckets of the report histogram (default d; discrete SW, bucketize=br, outputs "
        "d + 2b values)",
        at_least=2,
        at_most=MAX_BUCKETS,
        when={"method": SW_METHODS, "bucketize": ("rb",)},
    )
    band: float | None = option(
        None,
        "SW: b, the half-width of the band around v reported with density p (default b_SW(ε), "
        "the closed form maximising the mutual-information bound; the b sweep varies it)",
        above=0,
        at_most=1,
        when={"method": SW_METHODS, "bucketize": ("rb",)},
    )
    wave: Literal[WAVES] = option(
        "square",
        "SW: the General Wave's shape (spec §2.7): square (SW), trapezoid (top = trapezoid_ratio "
        "x base 2b) or triangle; densities between q and e^ε q, so each is ε-LDP",
        when={"method": SW_METHODS, "bucketize": ("rb",)},
    )
    trapezoid_ratio: float = option(
        0.8,
        "SW, wave=trapezoid: top/bottom length ratio of the trapezoid (the thesis's 0.2-0.8)",
        above=0,
        at_most=0.9,
        when={"method": SW_METHODS, "bucketize": ("rb",), "wave": ("trapezoid",)},
    )
    transition: Literal["auto", "dense", "structured"] = option(
        "auto",
        "EM/EMS: the transition matrix M as a dense d̃ x d array or as its structured O(d) "
        f"product (equal to rounding); auto = dense while d·d̃ <= {AUTO_DENSE_BUCKETS:,}², "
        f"dense at most {DENSE_BUCKETS:,}²",
        when={"method": SW_METHODS},
    )
    bucketize: Literal["rb", "br"] = option(
        "rb",
        "SW: rb = continuous SW, then bucketize (the paper's experiments); br = discrete SW",
        when={"method": SW_METHODS},
    )
    tolerance: float | None = option(
        None,
        "EM/EMS: stop when the log-likelihood gains less (default 1e-3·e^ε EM, 1e-3 EMS)",
        at_least=0,
        when={"method": SW_METHODS},
    )
    max_iterations: int = option(
        sw.MAX_ITERATIONS,
        "EM/EMS: at most this many iterations",
        at_least=1,
        when={"method": SW_METHODS},
    )
    bins: int = option(
        16, "cfo: number of bins c (must divide d)", at_least=2, when={"method": ("cfo",)}
    )
    branching: int = option(
        4,
        "hh, hh-admm: branching factor β (d must be a power of it)",
        at_least=2,
        when={"method": ("hh", "hh-admm")},
    )
    moments: Literal["both", "mean"] = option(
        "both",
        "sr, pm: both = half the users for the mean, half for the variance; mean = all",
        when={"method": MOMENT_METHODS},
    )
    users: int = option(
        100_000, "synthetic data: number of users n", at_least=1, size=True, source="synthetic"
    )
    beta_a: float = option(5.0, "synthetic data: Beta(a, b) shape a", above=0, source="synthetic")
    beta_b: float = option(2.0, "synthetic data: Beta(a, b) shape b", above=0, source="synthetic")
    column: str | None = option(None, "data file: the numerical column to estimate", source="file")
    bounds: list[float] | None = option(
        None, "data file: declared [low, high] of the column (mapped to [0, 1])", source="file"
    )
    missing: Literal["error", "drop"] = option(
        "error", "data file: a missing value is an error, or its row is dropped", source="file"
    )
    out_of_domain: Literal["refuse", "clip"] = option(
        "refuse",
        "data file: a value outside the declared bounds is refused, or clipped to them (the "
        "count is stated in the headline and the metrics)",
        source="file",
    )
    cohorts: int | None = option(
        None, "user-cohort actors (default: this machine's CPUs)", at_least=1
    )
    dropout: float = option(
        0.0, "fraction of users whose report does not arrive, per round", at_least=0, below=1
    )
    population: PopulationConfig = field(
        default_factory=PopulationConfig,
        metadata={"help": "who is online to report each round and how fast they answer"},
    )
    lost_users: Literal["resume", "dropouts"] = option(
        "resume",
        "when a cohort actor dies, restart it and ask its users again (nothing of theirs was "
        "released), or carry its users as permanent dropouts",
    )
    range_queries: int = option(
        1000, "random range queries per width for the range-query error", at_least=1
    )
    evaluate: bool = option(True, "add the error metrics (from the raw values: not private)")
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0)
        self.population.schedule(REPORT, {"report": self.dropout})  # unknown phases fail here
        if self.method not in SW_METHODS and self.epsilon > MAX_EPSILON_OTHERS:
            raise ConfigError(
                "epsilon",
                f"{self.method} takes ε up to {MAX_EPSILON_OTHERS:g}, got {self.epsilon:g}",
                "a smaller ε, or method=sw-ems",
            )
        if self.method in SW_METHODS and self.wave != "square":
            if self.epsilon > MAX_EPSILON_WAVES:
                raise ConfigError(
                    "epsilon",
                    f"the {self.wave} wave takes ε up to {MAX_EPSILON_WAVES:g}, got "
                    f"{self.epsilon:g} (its transition product loses precision as b shrinks)",
                    "a smaller ε, or wave=square",
                )
        if self.method in ("hh", "hh-admm") and self.buckets > DENSE_BUCKETS:
            raise ConfigError(
                "buckets",
                f"{self.method} takes d up to {DENSE_BUCKETS:,}, got {self.buckets:,} (OLH's "
                "support counts cost O(d·n); HH-ADMM's least squares is dense)",
                "sw-ems, cfo or haar-hrr for finer histograms",
            )
        if self.method == "cfo" and self.bins > DENSE_BUCKETS:
            raise ConfigError(
                "bins",
                f"cfo takes up to {DENSE_BUCKETS:,} bins, got {self.bins:,} (OLH's support "
                "counts cost O(bins·n))",
                "fewer bins, or sw-ems for finer histograms",
            )
        if self.transition == "dense" and self.buckets * self.output_width() > DENSE_BUCKETS**2:
            raise ConfigError(
                "transition",
                f"a dense {self.output_width():,} x {self.buckets:,} matrix is above "
                f"{DENSE_BUCKETS:,}²",
                "transition=auto or structured",
            )
        if self.method == "cfo" and (self.bins < 2 or self.buckets % self.bins):
            raise ConfigError(
                "bins", f"{self.bins} bins must be >= 2 and divide d = {self.buckets}", "16, 32, 64"
            )
        if self.method in ("hh", "hh-admm"):
            _require_power(self.buckets, self.branching, "buckets")
        if self.method == "haar-hrr":
            _require_power(self.buckets, 2, "buckets")
        if self.bounds is not None and (
            len(self.bounds) != 2 or not self.bounds[0] < self.bounds[1]
        ):
            raise ConfigError("bounds", f"must be [low, high] with low < high, got {self.bounds}")
        if self.data.columns is not None:  # a party split, with a file too: one column is read
            raise ConfigError(
                "data.columns", "square-wave estimates one column", "set column instead"
            )

    def output_width(self) -> int:
        """d̃: continuous SW's report buckets, or discrete SW's d + 2b outputs."""
        if self.bucketize == "br":
            return self.buckets + 2 * sw.discrete_parameters(self.epsilon, self.buckets)[0]
        return self.output_buckets or self.buckets

    def wave_ratio(self) -> float:
        """The wave's top/bottom length ratio: 1 square, 0 triangle."""
        return wave.SHAPES.get(self.wave, self.trapezoid_ratio)

    def structured(self) -> bool:
        """Whether EM/EMS multiplies by M through its structured product."""
        if self.transition == "auto":
            return self.buckets * self.output_width() > AUTO_DENSE_BUCKETS**2
        return self.transition == "structured"

    def em_tolerance(self) -> float:
        if self.tolerance is not None:
            return self.tolerance
        return 1e-3 * (math.exp(self.epsilon) if self.method == "sw-em" else 1.0)


def _require_power(d: int, base: int, name: str) -> None:
    h = round(math.log(d, base))
    if base**h != d or h < 1:
        raise ConfigError(name, f"{d} is not a power of {base}", f"e.g. {base**4}")
