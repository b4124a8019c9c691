"""Private mean estimation in ``secure-sum`` (``dp_mechanism`` = gaussian | ddg | skellam).

Each user holds a row of ``dim`` reals with ℓ2 norm at most ``clip`` (the synthetic inputs,
uniform on [-clip, clip]^dim as without DP, then each row scaled down to ℓ2 norm ``clip`` where
it is longer: stated in the result). The run releases the mean over the survivors U3: the
decoded noisy sum divided by |U3| (public: the server learns who survived), one release
declared here as a :class:`~rayfed.privacy.Measurement` for zero-out neighbours: one user's row
replaced by the empty record while the user stays registered and still sends its share (the
distributed events compare sums of the same number of shares; under add/remove the removed
user's share would leave with it, a variance mismatch they do not count).

* ``gaussian``: each user adds N(0, σ²/q) to its float row, σ = z·clip (the continuous
  distributed Gaussian of LFL federated-mf, :class:`~rayfed.privacy.measurement.
  DistributedGaussianShare`); the rows are fixed-point encoded with the coordinate clip widened
  to clip + 8 share sd (a coordinate beyond it is clipped: probability ~10^-15 each, unanalysed,
  as LFL's).
* ``ddg`` / ``skellam``: :mod:`rayfed.secagg.ddp` — ℓ2 clip, randomized Hadamard rotation
  (public signs from the run seed), scale γ, conditional randomized rounding keyed by user id —
  then each user's integer share (:class:`~rayfed.privacy.measurement.DiscreteGaussianShares` /
  :class:`~rayfed.privacy.measurement.SkellamShares`), ring words mod 2^bits into the secure
  sum; the coordinator decodes. Δ₂ (and Δ₁) are the pipeline's rounded norm bounds in integer
  units, exact (the rounding re-rounds a row until its integer norm fits).

**Dropouts and colluding users: the worst accepted outcome is charged.** Secure aggregation
completes with any U3 of at least ``min_survivors`` users, and its parameters assume c = ⌈γn⌉
users (``corrupt_fraction``) colluding with the server, who know their own shares and subtract
them. So each user's share is calibrated for a sum of only q = min_survivors − c honest shares
(the event's quorum, :attr:`~rayfed.secagg.params.SecAggParams.honest_survivors`): the guarantee
holds against that coalition whoever drops. With more survivors the sum carries more noise than
the target needs ((n − c)/q times the variance at no dropout) — the price of worst-case charging.
``dp_dropout=add-then-remove`` (Dordis, skellam only) draws each share in components split at
honest counts q = g_0 < … < g_L = n − c; once U3 is known the survivors reveal the components
below the largest g_j <= |U3| − c (:func:`remove_step`) and the coordinator subtracts them,
leaving the honest survivors (|U3| − c)·T/g_j >= T: the same event, less excess.

The central continuous Gaussian at the same (ε, δ) (``central_z``, calibrated under
``tightest``) is evaluation only: no second release, its MSE (z·clip/|U3|)² is computed from σ.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rayfed.actors.base import Message, StepContext
from rayfed.errors import ConfigError
from rayfed.privacy import (
    Ball,
    Budget,
    DataDomain,
    Declared,
    Field,
    Measurement,
    Neighbours,
    PrivacyDeclaration,
    distributed,
    gaussian_noise_multiplier,
)
from rayfed.privacy.ledger import make_accountant
from rayfed.privacy.measurement import DistributedGaussianShare, SkellamExcess
from rayfed.secagg import FixedPoint
from rayfed.secagg.ddp import DdpPlan
from rayfed.secagg.params import SecAggParams

RELATION = Neighbours("replace_special", "user")
ACCOUNTANT = "tightest"
#: the share's coordinate clip of ``gaussian``: the row's bound plus this many share sds (LFL's)
GAUSSIAN_SDS = 8.0
LABELS = {
    "gaussian": "noisy sum of the users' rows (distributed continuous Gaussian shares)",
    "ddg": "noisy integer sum of the users' rounded rows (distributed discrete Gaussian shares)",
    "skellam": "noisy integer sum of the users' rounded rows (distributed Skellam shares)",
}


@dataclass(frozen=True)
class DpParams:
    """The private mean's resolved parameters (public), built once in plan."""

    mechanism: str
    epsilon: float  # the target
    delta: float
    #: the event's count of shares: the honest users of the smallest accepted U3 (min_survivors
    #: less the ``corrupt`` users colluding with the server, who know their own shares)
    quorum: int
    measurement: Measurement
    #: the ε of the release's event under the ledger's accountant at δ (what the ledger reports)
    charged_epsilon: float
    #: evaluation only: the central continuous Gaussian's noise multiplier at (ε, δ), tightest
    central_z: float
    #: ddg / skellam: the pipeline (γ, Δ₂, Δ₁, bits, the share variance); None for gaussian
    pipeline: DdpPlan | None = None
    #: gaussian: the noise multiplier z (σ = z·clip on the sum of q shares)
    noise_multiplier: float = 0.0
    #: the rows' value columns in the cohorts' tables
    columns: tuple[str, ...] = ()
    #: add then remove: the survivor counts g_0 = q < … < g_L = n whose component boundaries the
    #: share is split at, and the measurement of the excess the survivors reveal (None: worst-case)
    levels: tuple[int, ...] = ()
    excess: Measurement | None = None
    #: c = ⌈γn⌉: the users secure aggregation assumes colluding with the server
    corrupt: int = 0

    def level(self, survivors: int) -> int:
        """j*: the largest j with g_j <= |U3| − c — the survivors remove components 0 … j*-1 and
        keep T/g_j* each (T the target variance of the sum): the at least |U3| − c honest ones
        hold (|U3| − c)·T/g_j* >= T."""
        return distributed.level(self.levels, survivors - self.corrupt)

    def noise_variance(self, survivors: int, removed: int = 0) -> float:
        """The sum's noise variance per integer coordinate with ``survivors`` shares, ``removed``
        of whose excess came back (the others keep their whole share)."""
        m = self.measurement.mechanism
        share = getattr(m, "sigma2", None) or m.variance
        if not self.levels or not removed:
            return survivors * share
        target = share * self.quorum
        return removed * target / self.levels[self.level(survivors)] + (survivors - removed) * share

    @property
    def width(self) -> int:
        """The secure sum's vector length: the padded dimension of the pipeline, or dim."""
        return (
            self.pipeline.padded_dim if self.pipeline is not None else self.measurement.domain.dim
        )


def default_delta(n: int) -> float:
    return 1.0 / n**2


def plan_dp(cfg, n: int, secagg: SecAggParams, dim: int, seed: int) -> DpParams:
    """The release, calibrated for (ε, δ) at q = the honest survivors' shares (``secagg``'s
    min_survivors less its colluding users) under the tightest accountant."""
    quorum = secagg.honest_survivors
    if quorum < 1:
        raise ConfigError(
            "corrupt_fraction",
            f"the {secagg.corrupt} colluding users leave no honest share among the "
            f"{secagg.min_survivors} survivors secure aggregation accepts",
            "a smaller corrupt_fraction or tolerated_dropout",
        )
    eps = float(cfg.epsilon)
    delta = float(cfg.delta) if cfg.delta is not None else default_delta(n)
    central_z = gaussian_noise_multiplier(
        eps, delta, steps=1, accountant=ACCOUNTANT, relation=RELATION.kind
    )
    domain = Ball(float(cfg.clip), 2, dim)
    columns = tuple(f"x{j}" for j in range(dim))
    label = f"secure-sum: {LABELS[cfg.dp_mechanism]}"
    pipeline, z = None, 0.0
    if cfg.dp_mechanism == "gaussian":
        z = central_z
        share = DistributedGaussianShare(z, 1.0 / quorum, quorum)
        m = Measurement(label, share, domain, RELATION, shared=True)
    else:
        pipeline, mechanism = distributed.calibrated_shares(
            cfg.dp_mechanism,
            eps,
            delta,
            quorum=quorum,
            users=n,
            dim=dim,
            clip=float(cfg.clip),
            bits=int(cfg.bits),
            rotation_seed=int(seed),
        )
        if cfg.dp_dropout == "add-then-remove":
            levels = distributed.survivor_levels(quorum, n - secagg.corrupt)
            mechanism = dataclasses.replace(
                mechanism,
                components=distributed.excess_components(mechanism.variance * quorum, levels),
            )
        reason = (
            f"the pipeline's rounded norm bound in integer units: a row of ℓ2 norm <= "
            f"{cfg.clip:g}, rotated, scaled by γ = {pipeline.gamma:.6g} and conditionally "
            f"rounded has Σ x_j² <= {pipeline.l2_bound_sq} (checked in integers)"
        )
        m = Measurement(
            label,
            mechanism,
            domain,
            RELATION,
            declared=Declared(pipeline.l2_bound, reason),
            shared=True,
        )
    excess = None
    if cfg.dp_dropout == "add-then-remove":
        excess = Measurement(
            "secure-sum: add then remove, the survivors' excess share components",
            SkellamExcess(m.mechanism),
            domain,
            RELATION,
            declared=m.declared,
        )
    acc = make_accountant(ACCOUNTANT, RELATION.kind)
    acc.compose(m.event)
    return DpParams(
        mechanism=cfg.dp_mechanism,
        epsilon=eps,
        delta=delta,
        quorum=quorum,
        measurement=m,
        charged_epsilon=float(acc.get_epsilon(delta)),
        central_z=central_z,
        pipeline=pipeline,
        noise_multiplier=z,
        columns=columns,
        levels=distributed.survivor_levels(quorum, n - secagg.corrupt)
        if excess is not None
        else (),
        excess=excess,
        corrupt=secagg.corrupt,
    )


def encoding(cfg, n: int, dp: DpParams) -> FixedPoint:
    """The ring of the secure sum: 2^bits words for ddg / skellam (the pipeline's own), the
    fixed-point encoding of a noisy float row for gaussian (coordinate clip + 8 share sds)."""
    if dp.pipeline is not None:
        return FixedPoint(float(cfg.clip), int(cfg.frac_bits), int(cfg.bits))
    sd = dp.noise_multiplier * cfg.clip / math.sqrt(dp.quorum)
    return FixedPoint.choose(n, cfg.clip + GAUSSIAN_SDS * sd, cfg.frac_bits, cfg.modulus_bits)


def declaration(cfg, dp: DpParams, statement: str) -> PrivacyDeclaration:
    return PrivacyDeclaration(
        budget=Budget(dp.epsilon, dp.delta),
        accountant=ACCOUNTANT,
        relation=RELATION,
        composition="sequential",
        statement=statement,
        measurements=(dp.measurement,),
        requested_epsilon=dp.epsilon,
        data=DataDomain(
            fields=(Field(dp.columns, dp.measurement.domain),), members="cohorts", key="user_id"
        ),
    )


# --- the users' rows ------------------------------------------------------------------------------
def clip_rows(x: np.ndarray, clip: float) -> tuple[np.ndarray, int]:
    """Rows scaled down to ℓ2 norm ``clip`` where longer (and how many were)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    over = norms > clip
    x[over] *= (clip / norms[over])[:, None]
    return x, int(over.sum())


def rows_table(ids: np.ndarray, x: np.ndarray, columns: tuple[str, ...]) -> pa.Table:
    return pa.table({"user_id": ids, **{c: x[:, j] for j, c in enumerate(columns)}})


def table_rows(ctx: StepContext, ids: np.ndarray, columns) -> np.ndarray:
    """The users' rows from the cohort's table; a registered user without a row holds the zero
    row (zero-out's emptied user: the zero row, plus its share as every registered user's)."""
    table_ids = ctx.table.column("user_id").to_numpy()
    order = np.argsort(table_ids)
    at = np.minimum(np.searchsorted(table_ids[order], ids), max(len(order) - 1, 0))
    x = np.zeros((len(ids), len(columns)))
    if len(order) == 0:
        return x
    rows = order[at]
    held = table_ids[rows] == ids
    for j, c in enumerate(columns):
        x[held, j] = ctx.table.column(c).to_numpy()[rows[held]]
    return x


def private_inputs(ctx: StepContext, round: int, ids: np.ndarray, dp: DpParams):
    """The users' messages: (rows + Gaussian shares) or ring words of (rounded rows + integer
    shares), with the release's event (every cohort's message carries it: one charge)."""
    x = table_rows(ctx, ids, dp.columns)
    m = dp.measurement
    if dp.pipeline is None:
        return m(ctx.noise, x, round=round, ids=ids)
    p = dp.pipeline
    ints, _ = p.quantise(x, p.keyed_rounding(ctx.noise, ids))
    noisy, event = m(ctx.noise, ints, round=round, ids=ids)
    # the users whose share this incarnation drew (a restarted cohort in a secure run could not
    # regenerate the others' components: they keep their whole share, more noise)
    ctx.state["drawn"] = (round, np.asarray(ids))
    return p.to_words(np.asarray(noisy)), event


def remove_step(ctx: StepContext, survivors: np.ndarray, *, round: int, dp: DpParams, upto: int):
    """Add then remove: the cohort's surviving users' excess components (0 … upto-1), negated
    and added up, for the coordinator to subtract from the sum (ring words are exact)."""
    drawn_round, drawn = ctx.state.get("drawn", (None, np.array([], dtype=np.int64)))
    ids = np.asarray(drawn if drawn_round == round else [], dtype=np.int64)
    ids = ids[np.isin(ids, survivors)]
    width = dp.pipeline.padded_dim
    values, _ = dp.excess(
        ctx.noise,
        np.zeros((ids.size, width), dtype=np.int64),
        round=round,
        ids=ids,
        part_of=dp.measurement,
        upto=upto,
    )
    return Message(
        "excess",
        {"ids": ids, "excess": np.asarray(values, dtype=np.int64).sum(axis=0)},
        to="coordinator",
    )


def subtract(dp: DpParams, words: np.ndarray, excess: np.ndarray) -> np.ndarray:
    """The sum's words with the (negated) excess added, mod 2^bits."""
    bits = dp.pipeline.bits
    w = np.asarray(words).astype(np.int64) + np.asarray(excess, dtype=np.int64)
    return (w & np.int64((1 << bits) - 1)).astype(np.uint64)


def release(dp: DpParams, result, survivors: int) -> np.ndarray:
    """The coordinator's release: the decoded noisy sum over U3 divided by |U3|."""
    if dp.pipeline is None:
        total = np.asarray(result.sum, dtype=np.float64)
    else:
        total = dp.pipeline.decode(np.asarray(result.words))
    return total / max(survivors, 1)
