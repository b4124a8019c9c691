"""A deliberately wrong protocol for the sensitivity check's own test: each party releases a
Laplace-noised histogram of its users' categories, declares replace-one neighbours, and — the
mistake a newcomer made (issue: calibration, item 2) — declares Δ₁ = 1 by hand, the
add/remove-one sensitivity of a histogram. Under replace-one a user moves between two bins: the
histogram moves by 2. ``honest=True`` lets the domain rule derive Δ₁ = 2 instead."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.actors.base import Message
from rayfed.config import option
from rayfed.privacy import (
    Budget,
    DataDomain,
    Declared,
    Field,
    Laplace,
    Measurement,
    Neighbours,
    OneHot,
    PrivacyDeclaration,
)
from rayfed.protocols.base import Outcome, Plan, Protocol

RELATION = Neighbours("replace_one", "user's category")


@dataclass(frozen=True)
class HistogramConfig:
    users: int = option(200, "users", at_least=2, size=True)
    bins: int = option(4, "categories", at_least=2)
    honest: bool = option(False, "derive Δ from the domain instead of declaring 1")


def _release(cfg: HistogramConfig) -> Measurement:
    declared = (
        None
        if cfg.honest
        else Declared(1.0, "one user changes one count (wrong: that is add/remove)")
    )
    return Measurement(
        "noisy histogram", Laplace(1.0), OneHot(cfg.bins), RELATION, declared=declared
    )


def plan(cfg: HistogramConfig, seed: int) -> Plan:
    values = rng.stream(seed, "synthetic", 0, "misdeclared").integers(0, cfg.bins, cfg.users)
    table = pa.table({"category": values})
    m = _release(cfg)
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(1.0),
            accountant="pure",
            relation=RELATION,
            statement="one user's category, replaced",
            measurements=(m,),
            data=DataDomain((Field(("category",), OneHot(cfg.bins)),)),
        ),
        parties={"p0": (table, {"bins": cfg.bins})},
        params=m,
    )


def histogram_step(ctx, *, release: Measurement) -> Message:
    counts = np.bincount(ctx.table.column("category").to_numpy(), minlength=ctx.meta["bins"])
    noisy, event = release(ctx.noise, counts.astype(np.float64))
    return Message("histogram", noisy, dp_event=event)


def drive(fed, cfg, plan) -> Outcome:
    with fed.round(0):
        fed.charge([plan.params.charge("p0")])
        out = fed.parties.run(histogram_step, release=plan.params, phase="histogram")
    return Outcome(tables={"histogram": pa.table({"noisy": fed.get(out)["p0"]})})


class Misdeclared(Protocol):
    name = "misdeclared-histogram"
    summary = "a histogram whose Δ is declared for the wrong relation (test only)"
    Config = HistogramConfig
    examples = ({},)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
