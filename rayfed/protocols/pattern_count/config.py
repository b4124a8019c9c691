"""Options of ``rayfed run pattern-count``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfed.config import DataConfig, option
from rayfed.errors import ConfigError
from rayfed.ldp.patterns import exact_loss
from rayfed.privacy import check_budget
from rayfed.protocols.base import check_party_split


@dataclass(frozen=True)
class PatternCountConfig:
    """Options of ``rayfed run pattern-count``."""

    epsilon: float = option(1.0, "privacy budget of each party (pure ε-DP in VFL)", above=0)
    calibration: Literal["paper", "exact"] = option(
        "paper",
        "paper: ε'=ε/16 as Alg. 1 (true loss ≈ ε/2); exact: ε'=tanh(ε/4)/2, spends exactly ε (not in the paper)",
    )
    sample_rate: float = option(
        1.0, "p of the low-communication variant (Thm B.2); 1 sends every user", above=0, at_most=1
    )
    patterns: str | list[list[str | int]] = option(
        "all", "'all', or a list of patterns, each one value per party (index or declared label)"
    )
    max_patterns: int = option(
        1_000_000, "refuse to estimate more patterns than this (memory: 8 bytes each)", at_least=1
    )
    parties: int = option(
        2, "number of parties v (synthetic data, or to deal a file's columns evenly)", at_least=1
    )
    users: int = option(
        20_000, "synthetic data: number of users m", at_least=1, size=True, source="synthetic"
    )
    domain_size: int = option(
        3, "synthetic data: values per party (M + 1)", at_least=2, size=True, source="synthetic"
    )
    correlation: float = option(
        0.5,
        "synthetic data: probability that a party copies party 0's value",
        at_least=0,
        at_most=1,
        source="synthetic",
    )
    domains: dict[str, int | list[str | int]] | None = option(
        None,
        "data file: declared domain per column, a size n (values 0..n-1) or the list of values",
        source="file",
    )
    out_of_domain: Literal["error", "zero"] = option(
        "error",
        "a data value outside its declared domain: error, or encode it as all-zero (spec §2.1)",
    )
    evaluate: bool | None = option(
        None,
        "add true counts and errors (non-private, computed outside the protocol); default: synthetic data only",
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0)
        check_party_split(self)
        if self.calibration == "paper" and not (
            self.epsilon < 8 and exact_loss(self.epsilon / 16) <= self.epsilon
        ):
            raise ConfigError(
                "epsilon",
                f"with calibration=paper, ε={self.epsilon} gives ε'=ε/16 whose exact loss "
                "exceeds ε",
                "epsilon <= 7.6 (the paper's theorems assume < 0.5), or calibration=exact",
            )
        if isinstance(self.patterns, str) and self.patterns != "all":
            raise ConfigError(
                "patterns", f"unknown value {self.patterns!r}", "'all' or a list of patterns"
            )
        for col, dom in (self.domains or {}).items():
            if isinstance(dom, int) and dom < 1 or isinstance(dom, list) and not dom:
                raise ConfigError(
                    f"domains.{col}", f"empty domain {dom!r}", "a size >= 1 or a list of values"
                )
            if isinstance(dom, list) and len(set(map(str, dom))) != len(dom):
                raise ConfigError(f"domains.{col}", "lists a value twice", "distinct values")
