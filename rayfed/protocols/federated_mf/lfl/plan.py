"""Planning the LFL setting of ``federated-mf``: the ratings dealt to user cohorts, the noise
calibrated for T iterations, secure aggregation's parameters and the budget."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rayfed import mf, rng
from rayfed.data import per_user
from rayfed.dropout import Phases
from rayfed.errors import ConfigError
from rayfed.mf import gddr as gddr_maths
from rayfed.mf.lfl import applied_variance, noise_shares, round1_noise, threshold
from rayfed.privacy import (
    Ball,
    Budget,
    Declared,
    Interval,
    Measurement,
    Neighbours,
    PrivacyDeclaration,
    check_budget,
    distributed,
    gaussian_noise_multiplier,
    one_bit_scale,
)
from rayfed.privacy.calibration import shuffled_ldp_epsilon
from rayfed.privacy.ledger import make_accountant
from rayfed.privacy.measurement import (
    DistributedGaussianShare,
    OneBitReport,
    ReplacementShare,
    SkellamExcess,
)
from rayfed.protocols.base import Plan
from rayfed.protocols.federated_mf import ratings as ratings_data
from rayfed.protocols.federated_mf.config import FederatedMFConfig, calibration_accountant
from rayfed.protocols.federated_mf.lfl.params import GddrParams, LflParams, LflReleases
from rayfed.secagg import FixedPoint, find_params
from rayfed.secagg.ddp import DdpPlan
from rayfed.secagg.phases import PHASES
from rayfed.sizing import cohorts_adjusted, default_cohorts, default_server_shards

#: the share of users the secure aggregation's parameters assume corrupt (γ)
CORRUPT_FRACTION = 0.05

#: LFL's server step when ``lr`` is not given (:func:`server_lr`): κ_L, the noise's random walk
#: on one coordinate of V over the T iterations as a fraction of √(R/p), and γ_max, the
#: noise-free best; fitted on synthetic populations by benchmarks/federated_mf_lfl_rate.py (κ_L:
#: the largest κ whose learning curves fall in at least 2/3 of its cells; 0.5 ends lower on
#: average, by about 5 %, but its curves rise again)
SERVER_LR_KAPPA = 0.25
SERVER_LR_MAX = 16.0
#: GD-DR's server step when ``lr`` is not given: its update is not a sum over |U1| (no rule
#: fitted), the constant it always had
GDDR_LR = 2.0

#: what the plan reads from the data and uses without noise, stated rather than hidden (as the
#: VFL/HFL statements do): δ's default, n, m and the mean rating
GDDR_STATEMENT = (
    "per-user DP of the item embeddings V: ε0-LDP per iteration against the server; the "
    "central ε assumes a trusted shuffler (the server sees only the multiset of reports), which "
    "this simulation does not build (Feldman et al. 2021 Thm 3.1 per iteration at δ/T, basic "
    "composition over T); taken as public, not covered: the number of ratings (the default "
    "δ = 1/|ratings|), the number of users n (the quorum t = ⌈(1−ω)n⌉ a release needs, at which "
    "the shuffle bound and so ε0 are taken), the number of items m (the projection's default "
    "k = min(m, 64)) and the training mean rating that scales the initial embeddings"
)
STATEMENT = (
    "per-user DP of the published item embeddings V against the server, which sees "
    "every Round-1 secure-aggregation sum and every Round-2 message (dummy-row adjacency), "
    f"and the ⌈γn⌉ users secure aggregation assumes colluding with it (γ = {CORRUPT_FRACTION:g}), "
    "whose own "
    "noise shares it knows: the noise is counted over the honest users only; "
    "taken as public, not covered: the number of ratings (the default δ = 1/|ratings|), the "
    "number of users n (the registry secure aggregation runs over, the users of the ratings "
    "file, fixed: its threshold t = ⌈(1−ω)n⌉, the noise shares and the fixed-point encoding "
    "follow from it; a neighbour's user stays registered with no rating — a file without the "
    "user is another registry, not a neighbour), the number of items m (a gradient row's width m·p) and the training "
    "mean rating that scales the initial embeddings"
)


#: LFL's neighbours: one user's ratings replaced by none, the user staying registered (its device
#: sends the zero row and its noise share: "dummy-row adjacency", zero-out); GD-DR's shuffling
#: theorem is for one user replaced
RELATION = Neighbours("replace_special", "user")
GDDR_RELATION = Neighbours("replace_one", "user")


def plan(cfg: FederatedMFConfig, seed: int) -> Plan:
    gen = rng.stream(seed, "synthetic", 0, "federated-mf")
    ratings, clipped = ratings_data.load(cfg, gen)
    train, test = mf.split(ratings, cfg.test_fraction, gen, by_user=True)
    delta = cfg.delta if cfg.delta is not None else 1.0 / len(ratings)
    check_budget(cfg.epsilon, delta)
    n, m = ratings.n, ratings.m
    table = ratings_data.member_table(train, test)
    n_cohorts = default_cohorts(n, cfg.cohorts)
    dealt = per_user(table, "user_id", n_cohorts)
    users = {name: np.unique(t.column("user_id").to_numpy()) for name, t in dealt.items()}
    # each cohort's registered users are public (secure aggregation's registry): a user takes
    # part whether or not its table holds a rating of it; the server it is sized against decides
    # whether its users trust the server's survivor counts (lfl.steps.trusts_counts)
    cohorts = {
        name: (t, {"users": users[name], "threat_model": cfg.threat_model})
        for name, t in dealt.items()
    }
    method = cfg.resolved_method()
    rounds = cfg.iterations if method in ("lfl", "ldp", "gd-dr") else 1
    schedule = _schedule(cfg, method, users, rounds)
    gddr = _gddr(cfg, n, m, delta, seed) if method == "gd-dr" else None
    sensitivity = mf.row_gradient_radius(cfg.bound)  # a user's row G_i lies in this ball
    secagg = _secagg_params(cfg, n)
    pipeline, levels = None, ()
    if method == "lfl" and cfg.dp_mechanism != "gaussian":
        releases, pipeline, levels = _integer_releases(
            cfg, n, m, delta, sensitivity, seed, secagg.corrupt
        )
        shares = releases.round1.mechanism
        # the aggregate's integer noise sd over Δ₂ (what z is to the Gaussian), for the report
        z = math.sqrt(shares.variance * shares.quorum) / pipeline.l2_bound
    else:
        # GD-DR draws no Gaussian noise: its noise multiplier is not calibrated (reported as 0)
        z = (
            0.0
            if gddr
            else gaussian_noise_multiplier(
                cfg.epsilon,
                delta,
                steps=cfg.iterations,
                accountant=calibration_accountant(cfg),
                relation=RELATION.kind,
            )
        )
        releases = _releases(cfg, method, n, m, z, sensitivity, gddr, secagg.corrupt)
    budget = Budget(_charged_epsilon(cfg, method, releases, delta), delta)
    t = threshold(n, cfg.omega)
    if cfg.lr is not None or method not in ("lfl", "ldp", "gd-dr"):
        lr = cfg.lr  # a user-given γ wins; stage1 and central take no server step
    elif gddr is not None:
        lr = GDDR_LR
    else:
        sigma = summed_noise_std(
            cfg.mode,
            method,
            n,
            cfg.omega,
            z,
            sensitivity,
            secagg.corrupt,
            pipeline,
            releases.round1.mechanism.variance if pipeline is not None else 0.0,
        )
        lr = server_lr(sigma, t, cfg.bound, cfg.rank, cfg.iterations)
    return Plan(
        privacy=(_gddr_privacy if gddr else _privacy)(cfg, budget, releases),
        cohorts=cohorts,
        rounds=rounds,
        inputs=schedule.notes,
        adjusted=cohorts_adjusted(n, cfg.cohorts, n_cohorts),
        # a restarted cohort resumes from its users' checkpoint: restart it once per iteration
        cohort_restarts=cfg.iterations if cfg.lost_users == "resume" else 0,
        server_shards=default_server_shards(cfg.server_shards),
        evaluation={"train": train, "test": test},
        params=LflParams(
            method=method,
            n=n,
            m=m,
            delta=delta,
            z=z,
            sensitivity=sensitivity,
            secagg=secagg,
            encoding=(
                FixedPoint(sensitivity, 16, pipeline.bits)  # the ring 2^bits of RingWords
                if pipeline is not None
                else _encoding(n, _clip(cfg, method, n, z, sensitivity, secagg.corrupt))
            ),
            mean=float(train.rating.mean()),
            threshold=t,
            server_lr=lr,
            registry=np.arange(n, dtype=np.int64),
            schedule=schedule,
            releases=releases,
            clipped=clipped,
            gddr=gddr,
            ddp=pipeline,
            levels=levels,
        ),
    )


def _secagg_params(cfg: FederatedMFConfig, n: int):
    """Round 1's neighbour graph and threshold against the ``threat_model``'s server, tolerating
    a fraction ω of dropouts (a malicious model that cannot hold at that ω names ``omega``)."""
    try:
        return find_params(
            n, dropout=cfg.omega, corrupt=CORRUPT_FRACTION, threat_model=cfg.threat_model
        )
    except ConfigError as err:
        if err.field != "tolerated_dropout":
            raise
        allowed = err.allowed.replace("tolerated_dropout", "omega")
        raise ConfigError("omega", err.problem, allowed) from None


def _releases(
    cfg: FederatedMFConfig,
    method: str,
    n: int,
    m: int,
    z: float,
    sensitivity: float,
    gddr: GddrParams | None,
    corrupt: int,
) -> LflReleases:
    """Round 1's gradient rows with their distributed Gaussian shares (Δ₂: a user's row
    G_i = -2(x - ⟨u_i, v_j⟩)u_i lies in the ball of radius 2R^{3/2}: x and ⟨u_i, v_j⟩ in [0, R],
    ‖u_i‖ <= √R), and Round 2's replacements; or GD-DR's reports (one user's entry in [-c, c])."""
    if gddr is not None:
        k = gddr.projection.shape[0]
        report = OneBitReport(gddr.epsilon0, k * cfg.rank, gddr.clip, gddr.quorum, gddr.step_delta)
        entry = Interval(-gddr.clip, gddr.clip)
        return LflReleases(
            reports=Measurement("GD-DR one-bit reports", report, entry, GDDR_RELATION, shared=True)
        )
    if method not in ("lfl", "ldp"):
        return LflReleases()
    noise = round1_noise(cfg.mode, method, n, cfg.omega, z, sensitivity, corrupt)
    row = Ball(sensitivity, 2, m * cfg.rank)
    share = DistributedGaussianShare(z, noise["zeta1"], noise["quorum"], noise["zeta2"])
    # every cohort's message carries the one release's event (its users' shares): one charge
    round1 = Measurement(
        "Round 1: gradient rows with Gaussian shares", share, row, RELATION, shared=True
    )
    if noise["zeta2"] == 0:  # the LDP-level baseline: no replacement round
        return LflReleases(round1=round1)
    round2 = Measurement("Round 2: replacement shares", ReplacementShare(share), row, RELATION)
    return LflReleases(round1=round1, round2=round2)


def _integer_releases(
    cfg: FederatedMFConfig,
    n: int,
    m: int,
    delta: float,
    sensitivity: float,
    seed: int,
    corrupt: int,
) -> tuple[LflReleases, DdpPlan, tuple[int, ...]]:
    """Round 1 and Round 2 with integer Skellam shares (``dp_mechanism=skellam``).

    Round 1: each user's gradient row G_i (ℓ2 <= 2R^{3/2}) goes through the distributed-DP
    pipeline (:mod:`rayfed.secagg.ddp`: clip, rotate, scale γ, conditional rounding, keyed per
    user id) and gets a Skellam share of variance T/t, drawn as components of variances
    c_j = T/g_j − T/g_{j+1} (:func:`rayfed.privacy.distributed.excess_components`), with T the
    aggregate variance T iterations at (ε, δ) need at the pipeline's own Δ₂, Δ₁ and q = t − c the
    honest users of the worst accepted outcome (|U1| = t, c = ⌈γn⌉ of them colluding with the
    server, who know their own shares). The sum of any >= q honest shares is Skellam of
    variance >= T (Skellam is closed under sums): the event is
    :func:`~rayfed.privacy.mechanisms.distributed_skellam_event` at quorum q; the levels
    q = g_0 < … < g_L = n − c count honest users too.

    Round 2 (:class:`~rayfed.privacy.measurement.SkellamExcess`): the Gaussian's −ξ_i + ξ'_i
    with ξ'_i *fresh* has no exact integer event — the server sees each −ξ_i + ξ'_i, and ξ_i
    given it is not Skellam (the Gaussian's conditional is Gaussian of variance ζ1ζ2/(ζ1+ζ2),
    which is what F counts; Skellam's has no such law). So ξ'_i is the part of ξ_i that stays:
    a survivor sends −(its components below j*), j* the largest level with g_j <= |U1| − c, and
    keeps T/g_j*. What the server sees besides the sum is independent of the sum's noise,
    whose honest part is exactly Skellam of variance at least (|U1| − c)·T/g_j* >= T: the same
    event as Round 1's, whoever drops in either round (:func:`rayfed.mf.lfl.removal_variance`).
    """
    q = threshold(n, cfg.omega) - corrupt
    pipeline, shares = distributed.calibrated_shares(
        cfg.dp_mechanism,
        cfg.epsilon,
        delta,
        quorum=q,
        users=n,
        dim=m * cfg.rank,
        clip=sensitivity,
        bits=cfg.bits,
        rotation_seed=seed,
        steps=cfg.iterations,
        accountant=cfg.accountant,
    )
    levels = distributed.survivor_levels(q, n - corrupt)
    shares = dataclasses.replace(
        shares, components=distributed.excess_components(shares.variance * q, levels)
    )
    declared = Declared(
        pipeline.l2_bound,
        f"the pipeline's rounded norm bound in integer units: a gradient row of ℓ2 norm <= "
        f"{sensitivity:.6g} (2R^(3/2)), rotated, scaled by γ = {pipeline.gamma:.6g} and "
        f"conditionally rounded has Σ x_j² <= {pipeline.l2_bound_sq} (checked in integers)",
    )
    row = Ball(sensitivity, 2, m * cfg.rank)
    round1 = Measurement(
        "Round 1: rounded gradient rows with Skellam shares",
        shares,
        row,
        RELATION,
        declared=declared,
        shared=True,
    )
    round2 = Measurement(
        "Round 2: the survivors' excess Skellam share components",
        SkellamExcess(shares),
        row,
        RELATION,
        declared=declared,
    )
    return LflReleases(round1=round1, round2=round2), pipeline, levels


def _gddr(cfg: FederatedMFConfig, n: int, m: int, delta: float, seed: int) -> GddrParams:
    """GD-DR's constants. Each iteration's reports are released only if at least
    t = ⌈(1-ω)n⌉ arrive, so the shuffle bound is taken at t; ε0 is the largest per-report ε for
    which the T amplified releases compose to the target ε at δ."""
    k = cfg.gddr_dim or min(m, 64)
    if k > m:  # a projection reduces the m item rows; more rows only add cost
        raise ConfigError("gddr_dim", f"k = {k} exceeds the m = {m} items", f"gddr_dim <= {m}")
    clip = cfg.gddr_clip or gddr_maths.entry_bound(cfg.bound, k)
    quorum = threshold(n, cfg.omega)
    epsilon0 = shuffled_ldp_epsilon(cfg.epsilon, delta, users=quorum, steps=cfg.iterations)
    return GddrParams(
        projection=gddr_maths.projection(seed, k, m),
        clip=clip,
        epsilon0=epsilon0,
        step_delta=delta / cfg.iterations,
        quorum=quorum,
        scale=one_bit_scale(epsilon0, clip, k * cfg.rank),
    )


def _privacy(cfg: FederatedMFConfig, budget: Budget, releases: LflReleases) -> PrivacyDeclaration:
    if not releases.all():  # Stage 1 only, central SGD: references that release nothing noisy
        return PrivacyDeclaration.none(
            f"the {cfg.resolved_method()} reference adds no DP noise: not a private release"
        )
    return PrivacyDeclaration(
        budget=budget,
        accountant=cfg.accountant,
        relation=RELATION,
        composition="sequential",
        statement=STATEMENT,
        measurements=releases.all(),
        requested_epsilon=cfg.epsilon,
        data=ratings_data.data_domain(cfg, "cohorts", per_user=True),
    )


def _gddr_privacy(
    cfg: FederatedMFConfig, budget: Budget, releases: LflReleases
) -> PrivacyDeclaration:
    """Shuffled LDP releases compose by basic composition (the pure accountant); the shuffling
    theorem is for one user's data replaced."""
    return PrivacyDeclaration(
        budget=budget,
        accountant="pure",
        relation=GDDR_RELATION,
        composition="sequential",
        statement=GDDR_STATEMENT,
        measurements=releases.all(),
        requested_epsilon=cfg.epsilon,
        data=ratings_data.data_domain(cfg, "cohorts", per_user=True),
    )


#: GD-DR has no secure aggregation: a user sends one report per iteration, lost in its one phase
REPORT = Phases(("report",))


def _schedule(cfg: FederatedMFConfig, method: str, cohorts: dict[str, np.ndarray], rounds: int):
    """The users' availability and the population models: for LFL and LDP in Round 1's secure
    aggregation (its phases; the rate is lost at advertise, the user sending nothing that round);
    for GD-DR in its one phase ``report`` (SecAgg's phases are unknown there, a ConfigError naming
    population.rates.<phase>). Both rates read the same uniforms, so dropout=r loses the same
    users either way."""
    if method == "gd-dr":
        return cfg.population.schedule(REPORT, {"report": cfg.dropout}, cohorts, rounds=rounds)
    return cfg.population.schedule(PHASES, {"advertise": cfg.dropout}, cohorts, rounds=rounds)


def _charged_epsilon(
    cfg: FederatedMFConfig, method: str, releases: LflReleases, delta: float
) -> float:
    """The ε the ledger is declared with. Faithful mode runs as the thesis specifies although its
    guarantee is weaker, so its budget is the true ε of the T iterations' Round-1 releases (their
    event credits the worst-case effective noise) under the ledger's own accountant (budget and
    report agree), which the result reports next to the nominal one."""
    if not (method == "lfl" and cfg.mode == "faithful"):
        return cfg.epsilon
    acc = make_accountant(cfg.accountant, RELATION.kind)
    acc.compose(releases.round1.charge("run", times=cfg.iterations)[2])
    return float(acc.get_epsilon(delta)) * (1 + 1e-9)


def _clip(
    cfg: FederatedMFConfig, method: str, n: int, z: float, sensitivity: float, corrupt: int
) -> float:
    """The fixed-point clip of a Round-1 input: the gradient row plus 8 sd of its noise share."""
    zeta1 = noise_shares(cfg.mode, method, n, cfg.omega, threshold(n, cfg.omega), corrupt)[0]
    return sensitivity + 8 * z * sensitivity * math.sqrt(max(zeta1, 1e-12))


def _encoding(n: int, clip: float) -> FixedPoint:
    """Round 1's fixed-point encoding (2^16); its range follows from ``bound`` (and the noise),
    so a range it cannot encode is refused as ``bound``, the option that sets it."""
    try:
        return FixedPoint.choose(n, clip, 16)
    except ConfigError as err:
        raise ConfigError(
            "bound",
            f"Round 1's messages cannot be encoded at 2^16: {err.problem}",
            "a bound that keeps the clipped updates above 2^-16 (e.g. the default)",
        ) from err


def server_lr(
    noise_std: float,
    quorum: int,
    bound: float,
    rank: int,
    iterations: int,
    *,
    kappa: float = SERVER_LR_KAPPA,
    cap: float = SERVER_LR_MAX,
) -> float:
    """LFL's server step γ from public quantities only (``lr`` not given):
    γ = min(γ_max, κ_L·t·√(R/p) / (σ_S·√T)).

    The update V ← Π(V − γ/|U1|·(S1 + βN2)) adds to each coordinate of V noise of sd
    γ·σ_S/|U1| per iteration, σ_S the sd of the noise on one coordinate of S1 + βN2
    (:func:`summed_noise_std`); over T iterations its random walk has sd γ·σ_S·√T/|U1|. The rule
    holds that walk at κ_L·√(R/p) (a coordinate's scale: ‖v_j‖² <= R over p coordinates) at the
    smallest accepted |U1|, the threshold t = ``quorum``, and caps γ at γ_max, the noise-free
    best. Nothing private enters: σ_S follows from z, Δ, n, ω and the mode; R, p, T are options.
    σ_S > 0 always: ε <= 10⁴ (the config's bound) gives z > 0, and Skellam shares have variance
    > 0 (noise=none is VFL/HFL's only)."""
    walk = noise_std * math.sqrt(iterations) / quorum  # per unit γ
    return min(cap, kappa * math.sqrt(bound / rank) / walk)


def summed_noise_std(
    mode: str,
    method: str,
    n: int,
    omega: float,
    z: float,
    sensitivity: float,
    corrupt: int,
    pipeline: DdpPlan | None = None,
    share_variance: float = 0.0,
) -> float:
    """σ_S: the sd of the noise on one coordinate of the server's S1 + βN2 when |U1| = |U2| =
    t = ⌈(1−ω)n⌉ (the smallest accepted outcome), in the gradient's units.

    Gaussian shares: each of the t users adds ζ1σ² (σ = zΔ), each replaces it with ζ2σ² and
    the server weighs N2 by β, so the noise variance is (t(1−β)²ζ1 + tβ²ζ2)σ²
    (:func:`rayfed.mf.lfl.applied_variance`; the LDP baseline: tσ²). The integer mechanism's
    (``pipeline``): t Skellam shares of ``share_variance`` each in integer units, none removed at
    |U1| − c below the first level, decoded by 1/γ_pipeline."""
    t = threshold(n, omega)
    if pipeline is not None:
        return math.sqrt(t * share_variance) / pipeline.gamma
    zeta1, zeta2, beta = noise_shares(mode, method, n, omega, t, corrupt)
    f = applied_variance(zeta1, zeta2, beta, t, t)
    return z * sensitivity * math.sqrt(f)
