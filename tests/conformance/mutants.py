"""Protocols wrong in ways a review found the sensitivity check used to miss (each its own
small protocol, registered by ``test_sensitivity.py`` for its test):

* ``data-domain``: the domain is read off the data in ``plan`` (Interval(0, max x));
* ``cancelling-rows``: per-user rows released one by one, whose column sums cancel;
* ``two-party-sum``: one release drawn in shares by two parties that each hold a row of every
  user, with Δ sized for one row;
* ``unenforced``: data never brought into its declared domain.
"""

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
    Field,
    Gaussian,
    Interval,
    Laplace,
    Measurement,
    Neighbours,
    PrivacyDeclaration,
)
from rayfed.protocols.base import Outcome, Plan, Protocol

REPLACE = Neighbours("replace_one", "user")
UNIT = Interval(-1.0, 1.0)


@dataclass(frozen=True)
class Config:
    users: int = option(50, "users", at_least=2, size=True)


def _plan(m: Measurement, tables: dict, data: DataDomain, delta: float = 0.0) -> Plan:
    return Plan(
        privacy=PrivacyDeclaration(
            Budget(1.0, delta),
            "tightest" if delta else "pure",
            REPLACE,
            statement="one user replaced",
            measurements=(m,),
            data=data,
        ),
        parties={name: (table, {}) for name, table in tables.items()},
        params=m,
    )


def _drive(step):
    def drive(fed, cfg, plan) -> Outcome:
        with fed.round(0):
            fed.charge([plan.params.charge("run")])
            out = fed.get(fed.parties.run(step, m=plan.params, phase="release"))
        return Outcome(tables={"out": pa.table({p: np.ravel(v) for p, v in sorted(out.items())})})

    return drive


def sum_step(ctx, *, m):
    noisy, event = m(ctx.noise, np.array([ctx.table.column("x").to_numpy().sum()]))
    return Message("sum", noisy, dp_event=event, scope="run")


# --- the domain read off the data ---------------------------------------------------------------
def plan_data_domain(cfg, seed):
    x = rng.stream(seed, "synthetic", 0, "mutant").pareto(1.0, cfg.users)
    domain = Interval(0.0, float(x.max()))  # WRONG: a bound from the raw data
    m = Measurement("sum", Laplace(1.0), domain, REPLACE)
    return _plan(m, {"p0": pa.table({"x": x})}, DataDomain((Field(("x",), domain),)))


class DataDomainMutant(Protocol):
    name, summary, Config, examples = "mutant-data-domain", "test", Config, ({},)
    plan, drive = staticmethod(plan_data_domain), staticmethod(_drive(sum_step))


# --- per-user rows whose sum cancels -------------------------------------------------------------
def plan_rows(cfg, seed):
    x = np.clip(rng.stream(seed, "synthetic", 0, "mutant").normal(0, 0.3, cfg.users), -1, 1)
    m = Measurement("per-user rows", Gaussian(5.0), UNIT, REPLACE)
    table = pa.table({"uid": np.arange(cfg.users), "x": x})
    return _plan(m, {"p0": table}, DataDomain((Field(("x",), UNIT),), key="uid"), delta=1e-5)


def rows_step(ctx, *, m):
    x = ctx.table.column("x").to_numpy()
    rows = (x - np.roll(x, 1))[:, None]  # WRONG: a user's row holds its neighbour's value too
    noisy, event = m(ctx.noise, rows, ids=ctx.table.column("uid").to_numpy())
    return Message("rows", noisy, dp_event=event, scope="run")


class RowsMutant(Protocol):
    name, summary, Config, examples = "mutant-cancelling-rows", "test", Config, ({},)
    plan, drive = staticmethod(plan_rows), staticmethod(_drive(rows_step))


# --- one release in shares over two parties holding every user -----------------------------------
def plan_two_party(cfg, seed):
    gen = rng.stream(seed, "synthetic", 0, "mutant")
    uid = np.arange(cfg.users)
    tables = {p: pa.table({"uid": uid, "x": gen.uniform(-1, 1, cfg.users)}) for p in ("p0", "p1")}
    m = Measurement("sum over parties", Laplace(1.0), UNIT, REPLACE)  # WRONG: Δ of one row
    return _plan(m, tables, DataDomain((Field(("x",), UNIT),), key="uid"))


def share_step(ctx, *, m):
    part = np.array([ctx.table.column("x").to_numpy().sum()])
    if ctx.name == "p0":
        return sum_step(ctx, m=m)
    noisy, _ = m(ctx.noise, part, part_of=m)  # a share of the release p0's message carries
    return Message("share", noisy)


class TwoPartyMutant(Protocol):
    name, summary, Config, examples = "mutant-two-party-sum", "test", Config, ({},)
    plan, drive = staticmethod(plan_two_party), staticmethod(_drive(share_step))


# --- data never enforced --------------------------------------------------------------------------
def plan_unenforced(cfg, seed):
    x = rng.stream(seed, "synthetic", 0, "mutant").uniform(-50, 50, cfg.users)  # WRONG: no enforce
    m = Measurement("sum", Laplace(1.0), UNIT, REPLACE)
    return _plan(m, {"p0": pa.table({"x": x})}, DataDomain((Field(("x",), UNIT),)))


class UnenforcedMutant(Protocol):
    name, summary, Config, examples = "mutant-unenforced", "test", Config, ({},)
    plan, drive = staticmethod(plan_unenforced), staticmethod(_drive(sum_step))


MUTANTS = {
    "mutant-data-domain": "DataDomainMutant",
    "mutant-cancelling-rows": "RowsMutant",
    "mutant-two-party-sum": "TwoPartyMutant",
    "mutant-unenforced": "UnenforcedMutant",
}
