"""The checks every registered protocol passes, on the small configurations it declares
(``Protocol.examples``): a new protocol gets all of them by registering and declaring examples.

References are computed here, independently of the code under test: the ledger's composition is
recomputed from the reported entries with dp-accounting (or, for pure DP, by hand), bad option
values are generated from the options' declared types, choices and bounds, and noise is compared
through each actor's release fingerprints.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
import typing
from typing import Any, Literal

import numpy as np
import pytest
from dp_accounting import dp_event, pld, rdp
from dp_accounting.privacy_accountant import NeighboringRelation

import rayfed
from rayfed.api import resolve
from rayfed.errors import ConfigError, UnaccountedNoise
from rayfed.privacy.ledger import (
    RUN_SCOPE,
    DistributedDiscreteGaussianDpEvent,
    EpsilonDeltaDpEvent,
    SkellamDpEvent,
    UnitInSampledGroupGaussianDpEvent,
    event_from_dict,
)
from rayfed.privacy.source import NoiseSource
from rayfed.protocols import get_protocol

PROTOCOLS = sorted(rayfed.PROTOCOLS)
CASES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name in PROTOCOLS
    for i in range(len(get_protocol(name).examples))
]
TIMING_METRICS = {"phase_seconds", "ms_per_iteration"}  # wall-clock measurements

_RUNS: dict[tuple, rayfed.Result] = {}


def run(name: str, i: int, **extra: Any) -> rayfed.Result:
    """One run of example ``i`` (cached: several checks read the same run)."""
    key = (name, i, repr(sorted(extra.items())))
    if key not in _RUNS:
        options = {"backend": "local", "out_dir": None, **get_protocol(name).examples[i], **extra}
        _RUNS[key] = rayfed.run(name, **options)
    return _RUNS[key]


def same_tables(a: rayfed.Result, b: rayfed.Result) -> bool:
    return sorted(a.tables) == sorted(b.tables) and all(
        a.tables[k].equals(b.tables[k]) for k in a.tables
    )


def same_output(a: rayfed.Result, b: rayfed.Result) -> bool:
    """Identical tables and identical metrics (wall-clock measurements aside)."""
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMING_METRICS}  # noqa: E731
    return same_tables(a, b) and repr(strip(a.metrics)) == repr(strip(b.metrics))


def private(result: rayfed.Result) -> bool:
    return result.privacy.budget_epsilon > 0


# --- reproducibility ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,i", CASES)
def test_same_seed_gives_identical_tables_and_noise(name, i):
    a, b = run(name, i), run(name, i, seed=0, deadline_s=120.0)
    assert same_output(a, b)
    assert a.noise_fingerprints == b.noise_fingerprints


@pytest.mark.parametrize("name,i", CASES)
def test_secure_runs_draw_noise_the_seed_cannot_regenerate(name, i):
    """Two secure runs with the same seed share no draw — noise release or secret key — and
    neither shares one with the seeded run (how many draws a run makes may depend on its noise,
    e.g. DPLSF's tree); the result says which source it used. A fingerprint digests a release,
    and a release of one or two small noisy counts (DPLSF's deep levels) can repeat by chance:
    fewer than one in ten shared draws, or a single one among five or more, is chance (CI saw
    1 of 7 in vfl-kmeans 3); a seed-derived run would share them all."""
    seeded = run(name, i)
    a, b = run(name, i, randomness="secure"), run(name, i, seed=0, randomness="secure")
    assert a.privacy.randomness == b.privacy.randomness == "secure"
    assert seeded.privacy.randomness == "seeded"
    assert "secure randomness" in a.summary() and "seeded randomness" in seeded.summary()
    draws = [{d for ds in r.noise_fingerprints.values() for d in ds} for r in (seeded, a, b)]
    assert draws[0] and draws[1] and draws[2]  # noise, keys or both: every protocol draws
    for x, y in ((0, 1), (0, 2), (1, 2)):
        shared, fewest = draws[x] & draws[y], min(len(draws[x]), len(draws[y]))
        chance = max(fewest // 10, 1 if fewest >= 5 else 0)
        assert len(shared) <= chance, (x, y, len(shared), fewest)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_local_equals_ray(name, ray_cluster):
    assert same_output(run(name, 0, backend="ray"), run(name, 0))
    assert run(name, 0, backend="ray").noise_fingerprints == run(name, 0).noise_fingerprints


HOSTS_USERS = [
    name
    for name in PROTOCOLS
    if "cohorts" in {f.name for f in dataclasses.fields(get_protocol(name).Config)}
]


@pytest.mark.parametrize("name", HOSTS_USERS)
def test_results_do_not_depend_on_the_number_of_cohorts(name):
    """Where users live in cohort actors, 1 or 3 cohorts give the same result."""
    one, three = run(name, 0, cohorts=1), run(name, 0, cohorts=3)
    assert len(one.noise_fingerprints) == 2 and len(three.noise_fingerprints) == 4  # + coordinator
    assert same_tables(one, three)  # (the metrics name the cohorts)


#: population models on top of an example: Markov availability with a fast daily cycle and
#: log-normal stragglers against a tight deadline (both drop users in a 60-user example)
POPULATION = {
    "population": {
        "availability": "markov",
        "markov_off": 0.05,
        "diurnal": 0.5,
        "diurnal_period": 2,
        "latency": "lognormal",
        "latency_deadline_s": 8.0,
    }
}
HOSTS_MODELS = [
    name
    for name in HOSTS_USERS
    if "population" in {f.name for f in dataclasses.fields(get_protocol(name).Config)}
]


def test_the_population_checks_cover_the_protocols_with_models():
    assert {"secure-sum", "federated-mf", "square-wave"} <= set(
        HOSTS_MODELS
    )  # an empty list would skip them


@pytest.mark.parametrize("name", HOSTS_MODELS)
def test_population_models_are_seeded_and_do_not_depend_on_the_cohorts(name):
    """The same seed gives the same survivors (a fresh run, not the cached one), for 1 or 3
    cohorts; and the models act (the tables differ from the run without them)."""
    one, three = run(name, 0, cohorts=1, **POPULATION), run(name, 0, cohorts=3, **POPULATION)
    options = {**get_protocol(name).examples[0], **POPULATION, "cohorts": 1}
    again = rayfed.run(name, backend="local", out_dir=None, **options)
    assert same_tables(one, again) and same_tables(one, three)
    assert not same_tables(one, run(name, 0, cohorts=1))


# --- privacy accounting ---------------------------------------------------------------------------
def _event(d: dict) -> dp_event.DpEvent:
    """A DpEvent from the report's entry: dp-accounting's own named-tuple round trip."""
    fields = {k: v for k, v in d.items() if k not in ("round", "scope", "label", "epsilon_after")}
    return event_from_dict(fields)


def _group_sampled_rdp(event: dp_event.DpEvent, orders: np.ndarray) -> np.ndarray:
    """Σ of the RDP curves of the UnitInSampledGroupGaussian events in ``event``, written here
    from the mixture pair's bound (one rating of a Poisson-sampled user, spec federated-mf §2.4):
    log(1 − q + q·exp(α(α − 1)/(2z²)))/(α − 1) per release."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * _group_sampled_rdp(event.event, orders)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum((_group_sampled_rdp(e, orders) for e in event.events), np.zeros_like(orders))
    if isinstance(event, UnitInSampledGroupGaussianDpEvent):
        q, z = event.sampling_probability, event.noise_multiplier
        gaussian = orders * (orders - 1) / (2 * z * z)
        return np.logaddexp(np.log1p(-q), np.log(q) + gaussian) / (orders - 1)
    return np.zeros_like(orders)


def _integer_rdp(event: dp_event.DpEvent, orders: np.ndarray) -> np.ndarray:
    """Σ of the RDP curves of the integer-noise events (dp-accounting knows neither), written
    here from the papers, at ⌈α⌉: the distributed discrete Gaussian (Kairouz, Liu & Steinke 2021,
    Prop. 14: n shares of N_Z(0, σ²), a = Δ₂/√(nσ²), b = Δ₁/√(nσ²), τ = 10·Σ_{k<n}
    e^{−2π²σ²k/(k+1)}: min{αa²/2 + τd, α(a² + 2bτ + τ²d)/2, α(a + √d·τ)²/2}) and Skellam
    (Agarwal, Kairouz & Liu 2021, Thm 3.5: αΔ₂²/(2μ) + min{((2α−1)Δ₂² + 6Δ₁)/(4μ²), 3Δ₁/(2μ)})."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * _integer_rdp(event.event, orders)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum((_integer_rdp(e, orders) for e in event.events), np.zeros_like(orders))
    a = np.ceil(orders)
    if isinstance(event, SkellamDpEvent):
        mu, l2, l1 = event.variance, event.l2_sensitivity, event.l1_sensitivity
        return a * l2**2 / (2 * mu) + np.minimum(
            ((2 * a - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu)
        )
    if isinstance(event, DistributedDiscreteGaussianDpEvent):
        n, s2, d = event.num_shares, event.sigma2, event.dim
        tau = 10 * sum(math.exp(-2 * math.pi**2 * s2 * k / (k + 1)) for k in range(1, n))
        x, y = event.l2_sensitivity / math.sqrt(n * s2), event.l1_sensitivity / math.sqrt(n * s2)
        return np.minimum.reduce(
            [
                a * x**2 / 2 + tau * d,
                a / 2 * (x**2 + 2 * y * tau + tau**2 * d),
                a / 2 * (x + math.sqrt(d) * tau) ** 2,
            ]
        )
    return np.zeros_like(orders)


_UNKNOWN_TO_DP_ACCOUNTING = (
    UnitInSampledGroupGaussianDpEvent,
    SkellamDpEvent,
    DistributedDiscreteGaussianDpEvent,
)


def _holds_integer(event: dp_event.DpEvent) -> bool:
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _holds_integer(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_holds_integer(e) for e in event.events)
    return isinstance(event, (SkellamDpEvent, DistributedDiscreteGaussianDpEvent))


def _without_group_sampled(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """``event`` without the events dp-accounting does not know (their curves are added here)."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(_without_group_sampled(event.event), event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([_without_group_sampled(e) for e in event.events])
    if isinstance(event, _UNKNOWN_TO_DP_ACCOUNTING):
        return dp_event.NoOpDpEvent()
    return event


def _pure(event: dp_event.DpEvent) -> tuple[float, float]:
    """Basic composition by hand: (Σε, Σδ)."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        eps, delta = _pure(event.event)
        return event.count * eps, event.count * delta
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [_pure(e) for e in event.events]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(event, dp_event.LaplaceDpEvent):
        return 1 / event.noise_multiplier, 0.0
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity, 0.0
    if isinstance(event, dp_event.RandomizedResponseDpEvent):
        p, k = event.noise_parameter, event.num_buckets
        return math.log1p(k * (1 - p) / p), 0.0
    if isinstance(event, EpsilonDeltaDpEvent):
        return event.epsilon, event.delta
    raise AssertionError(f"not a pure-DP event: {event}")


def _rdp_epsilon(composed: dp_event.DpEvent, relation, delta: float) -> float:
    acc = rdp.RdpAccountant(neighboring_relation=relation)
    acc.compose(_without_group_sampled(composed))
    # dp_accounting does not know the group-sampled Gaussian: its curve is added here
    orders = np.asarray(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=float)
    curve = acc._rdp + _group_sampled_rdp(composed, orders) + _integer_rdp(composed, orders)
    return rdp.rdp_privacy_accountant.compute_epsilon(orders, curve, delta)[0]


def _pld_epsilon(composed: dp_event.DpEvent, relation, delta: float) -> float:
    """PLD's ε; for replace-one neighbours without sampling, the add/remove pair at the charged
    distance (rayfed's events measure noise against the relation's own Δ, as RDP does). The
    group-sampled Gaussians (dp-accounting does not know them) get the PLD of their dominating
    pair written here: no loss with probability 1 − q, the Gaussian's with probability q (the
    tagged mixture), composed with the rest."""
    if relation == NeighboringRelation.REPLACE_ONE:
        relation = NeighboringRelation.ADD_OR_REMOVE_ONE
    acc = pld.PLDAccountant(neighboring_relation=relation)
    acc.compose(_without_group_sampled(composed))
    total = acc._pld
    for event, count in sorted(_group_sampled_counts(composed).items(), key=repr):
        gaussian = pld.privacy_loss_distribution.from_gaussian_mechanism(event.noise_multiplier)
        mixture = gaussian.compute_mixture(
            pld.privacy_loss_distribution.identity(), event.sampling_probability
        )
        total = total.compose(mixture.self_compose(count) if count > 1 else mixture)
    return total.get_epsilon_for_delta(delta)


def _group_sampled_counts(event: dp_event.DpEvent, count: int = 1, out=None) -> dict:
    """Each group-sampled Gaussian ``event`` composes, with how often."""
    out = {} if out is None else out
    if isinstance(event, dp_event.SelfComposedDpEvent):
        _group_sampled_counts(event.event, count * event.count, out)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for sub in event.events:
            _group_sampled_counts(sub, count, out)
    elif isinstance(event, UnitInSampledGroupGaussianDpEvent):
        out[event] = out.get(event, 0) + count
    return out


def _compose(events: list, report) -> float:
    relation = NeighboringRelation[report.neighboring_relation.upper()]
    if report.accountant == "pure":
        eps, delta = _pure(dp_event.ComposedDpEvent(events))
        return eps if delta <= report.budget_delta + 1e-15 else math.inf
    composed = dp_event.ComposedDpEvent(events)
    if report.accountant == "rdp":
        return _rdp_epsilon(composed, relation, report.budget_delta)
    if report.accountant == "pld":
        return (
            pld.PLDAccountant(neighboring_relation=relation)
            .compose(composed)
            .get_epsilon(report.budget_delta)
        )
    if _holds_integer(composed):  # RDP-only events: the tightest accountant is RDP alone
        return _rdp_epsilon(composed, relation, report.budget_delta)
    return min(
        _rdp_epsilon(composed, relation, report.budget_delta),
        _pld_epsilon(composed, relation, report.budget_delta),
    )


@pytest.mark.parametrize("name,i", CASES)
def test_reported_epsilon_is_the_composition_of_the_ledger(name, i):
    """ε = the declared accountant over the charged events, each scope with the run-wide ones
    (parallel) or all together (sequential); within the budget; an excess over the requested ε
    is in the headline."""
    result = run(name, i)
    report = result.privacy
    entries = [(e["scope"], _event(e)) for e in report.entries]
    if report.composition == "sequential" or not entries:
        expected = _compose([e for _, e in entries], report) if entries else 0.0
    else:
        shared = [e for scope, e in entries if scope == RUN_SCOPE]
        scopes = {scope for scope, _ in entries} - {RUN_SCOPE} or {RUN_SCOPE}
        expected = max(
            _compose(shared + [e for s, e in entries if s == scope and s != RUN_SCOPE], report)
            for scope in scopes
        )
    assert report.epsilon == pytest.approx(expected, rel=1e-9)
    assert report.epsilon <= report.budget_epsilon * (1 + 1e-9)
    assert bool(entries) == private(result)
    requested = report.requested_epsilon
    if requested is not None and report.epsilon > requested * (1 + 1e-9):
        assert f"ε spent {report.epsilon:.4g} > ε requested {requested:g}" in result.headline


@pytest.mark.parametrize("name,i", CASES)
def test_statement_names_the_ledgers_composition(name, i):
    """A statement that says its scopes compose in parallel has a parallel ledger, and only then."""
    report = run(name, i).privacy
    assert ("parallel" in report.statement) == (report.composition == "parallel"), report.statement


@pytest.mark.parametrize("name,i", CASES)
def test_every_dp_message_carries_an_event_its_step_drew(name, i, monkeypatch):
    """With the mechanisms' registration switched off, a private run is refused at its first DP
    message: every event a message carries comes from a mechanism drawn in that step."""
    result = run(name, i)
    assert (result.transcript_totals["dp_messages"] > 0) == private(result)
    original = NoiseSource.register
    monkeypatch.setattr(
        NoiseSource,
        "register",
        lambda self, event, release=None, **kw: original(self, None, release, **kw),
    )
    options = {"backend": "local", "out_dir": None, **get_protocol(name).examples[i]}
    if private(result):
        with pytest.raises(UnaccountedNoise, match="did not draw"):
            rayfed.run(name, **options)
    else:
        assert same_output(rayfed.run(name, **options), result)


# --- bad input ------------------------------------------------------------------------------------
def _bad_values(tp: Any, bounds) -> list[Any]:
    """Values of the wrong type, outside the choices, or outside the bounds of an option."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        kinds = args
    else:
        kinds = [tp]
    literal = [a for k in kinds if typing.get_origin(k) is Literal for a in typing.get_args(k)]
    plain = [k for k in kinds if typing.get_origin(k) is not Literal]
    out: list[Any] = []
    if literal and str not in plain:
        out.append("not-a-choice")
    if bool in plain:
        out.append("maybe")
    numbers = [k for k in plain if k in (int, float)]
    if numbers:
        if str not in plain and not literal:
            out.append("abc")
        if numbers == [int]:
            out.append(1.5)
        else:
            out.append(float("nan"))
        if bounds is not None:
            low = bounds.at_least if bounds.at_least is not None else bounds.above
            high = bounds.at_most if bounds.at_most is not None else bounds.below
            step = 1 if numbers == [int] else 0.5
            if low is not None:
                out.append(low if bounds.above is not None else low - step)
            if high is not None:
                out.append(high if bounds.below is not None else high + step)
    if any(typing.get_origin(k) in (dict, list) for k in plain) and str not in plain:
        out.append(12345)
    return out


def _option_cases(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    cases = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            cases += _option_cases(tp, f"{prefix}{f.name}.")
            continue
        cases += [(prefix + f.name, v) for v in _bad_values(tp, f.metadata.get("bounds"))]
    return cases


def _nested(name: str, value: Any) -> dict:
    head, _, rest = name.partition(".")
    return {head: _nested(rest, value) if rest else value}


@pytest.mark.parametrize("name", PROTOCOLS)
def test_every_bad_option_value_is_a_config_error_naming_the_option(name):
    cases = _option_cases(get_protocol(name).Config) + _option_cases(rayfed.RunOptions)
    assert len(cases) > 10
    for option, value in cases:
        with pytest.raises(ConfigError) as err:
            resolve(name, _nested(option, value))
        assert err.value.field == option or err.value.field.startswith(option + "."), (
            option,
            value,
            err.value,
        )


@pytest.mark.parametrize("name", PROTOCOLS)
def test_an_oversized_run_is_refused_before_any_data_is_built(name, monkeypatch):
    proto_cls = type(get_protocol(name))
    sizes = [f.name for f in dataclasses.fields(proto_cls.Config) if f.metadata.get("size")]
    assert sizes, f"{name} declares no size option"

    def no_plan(self, cfg, seed):
        raise AssertionError("plan ran: data was built before the size check")

    monkeypatch.setattr(proto_cls, "plan", no_plan)
    for option in sizes:
        # an example whose mode reads the option (others refuse it as unused: not the point here)
        usable = [e for e in proto_cls.examples if _accepts(name, {**e, option: 10**12})]
        assert usable, f"no example of {name} accepts {option}"
        with pytest.raises(ConfigError, match="GiB") as err:
            rayfed.run(name, backend="local", out_dir=None, **{**usable[0], option: 10**12})
        assert err.value.field == option


def _accepts(name: str, options: dict) -> bool:
    try:
        resolve(name, options)
    except ConfigError:
        return False
    return True


def test_the_size_check_runs_on_ray_too(ray_cluster):
    with pytest.raises(ConfigError, match="Ray cluster") as err:
        rayfed.run("square-wave", out_dir=None, users=10**12)
    assert err.value.field == "users"


def test_every_protocol_declares_examples_that_differ():
    for name in PROTOCOLS:
        examples = get_protocol(name).examples
        assert examples and len({repr(sorted(e.items())) for e in examples}) == len(examples)
        assert np.all([isinstance(e, dict) for e in examples])


# --- faults and messages ------------------------------------------------------------------------
@pytest.mark.parametrize("name,i", CASES)
def test_every_phase_a_member_runs_is_declared(name, i):
    """``--fail ...@phase=P`` is refused unless P is among the protocol's declared phases: every
    phase its parties and cohorts run must be declared, or a fault there would be refused."""
    result = run(name, i)
    ran = {t["phase"] for t in result.timings if t["role"] in ("parties", "cohorts")}
    assert ran <= set(get_protocol(name).phases), ran - set(get_protocol(name).phases)


def _settable(cls: type, prefix: str = "") -> set[str]:
    """Every option name a user can set (dotted for nested ones)."""
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        out.add(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out |= _settable(hints[f.name], f"{prefix}{f.name}.")
    return out


def _edge_values(tp: Any, bounds: Any, default: Any) -> list[Any]:
    """Values each option's declaration accepts at its edges: the smallest and largest it admits
    (just inside an open bound), and a large one where it has no upper bound."""
    kinds = [k for k in _options_types(tp) if k in (int, float)]
    if not kinds or bounds is None:
        return []
    integer = kinds == [int]
    eps = 1 if integer else 1e-9
    out = []
    if bounds.at_least is not None:
        out.append(bounds.at_least)
    elif bounds.above is not None:
        out.append(bounds.above + eps)
    if bounds.at_most is not None:
        out.append(bounds.at_most)
    elif bounds.below is not None:
        out.append(bounds.below - eps)
    elif not integer:  # (a count's largest value is a size: the size check's business)
        out += [1e6, 1e9]
    return out


def _options_types(tp: Any) -> list[Any]:
    return (
        list(typing.get_args(tp))
        if typing.get_origin(tp) in (typing.Union, types.UnionType)
        else [tp]
    )


def _edge_cases(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    cases = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            cases += _edge_cases(tp, f"{prefix}{f.name}.")
            continue
        cases += [
            (prefix + f.name, v) for v in _edge_values(tp, f.metadata.get("bounds"), f.default)
        ]
    return cases


class _Slow(Exception):
    pass


def _alarm(*_):
    raise _Slow


@pytest.mark.parametrize("name", PROTOCOLS)
def test_every_config_error_a_protocol_raises_names_a_settable_option(name):
    """Each option of each example set to the edges of what it accepts: where the run is refused
    (at configuration or at planning, before any actor), the ConfigError's field is an option the
    user can set (or a dotted path into one), never an internal parameter's name."""
    import signal

    from rayfed.api import _prepare, _reconcile

    proto = get_protocol(name)
    settable = _settable(proto.Config) | _settable(rayfed.RunOptions)
    wrong = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for option, value in _edge_cases(proto.Config):
            # the first example whose mode reads the option (the others refuse it, naming it)
            usable = [e for e in proto.examples if _accepts(name, {**e, **_nested(option, value)})]
            for example in usable[:1] or proto.examples[:1]:
                options = {**example, "backend": "local", "out_dir": None}
                signal.alarm(2)  # a plan that builds much: not this check's business
                try:
                    _, run_opts, cfg = resolve(name, {**options, **_nested(option, value)})
                    cfg, run_opts = _reconcile(proto, cfg, run_opts)
                    _prepare(proto, cfg, run_opts)
                except ConfigError as err:
                    head = err.field.split(".")
                    if not any(".".join(head[:j]) in settable for j in range(1, len(head) + 1)):
                        wrong.append((option, value, err.field, str(err)))
                except Exception:  # noqa: BLE001 - other failures are another check's business
                    pass
                finally:
                    signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not wrong, wrong


#: options that shrink a protocol's examples so that each edge run takes well under a second
#: (each applied only where the example's mode reads it)
_SMALL: dict[str, dict[str, Any]] = {
    "federated-mf": {
        "users": 40,
        "items": 10,
        "iterations": 1,
        "cohorts": 1,
        "pretrain_steps": 1,
        "finetune_steps": 0,
        "local_steps": 1,
        "rank": 2,
        "accountant": "rdp",  # PLD's search takes seconds per budget: RDP's, milliseconds
        "delta": 1e-5,  # (the default 1/ratings of so few ratings calibrates slowly)
    },
    "hfl-kmeans": {"users": 400, "iterations": 2},
    "ldp-bitvector": {"records": 40, "bits": 16},
    "pattern-count": {"users": 300},
    "secure-sum": {"users": 30, "dim": 2},
    "square-wave": {"users": 500, "buckets": 64, "output_buckets": 64},
    "vfl-kmeans": {"users": 300, "sketches": 32},
    "vfl-primitives": {"users": 300},
}
#: options whose edges run on every example (mode) that reads them
_BUDGET = {"epsilon", "delta"}
#: the seconds one edge run may take before it counts as a failure of its own (slow)
_EDGE_RUN_S = 15


def _small(name: str, example: dict[str, Any]) -> dict[str, Any]:
    out = dict(example)
    for key, value in _SMALL.get(name, {}).items():
        if _accepts(name, {**out, key: value}):
            out[key] = value
    return out


def _edge_outcome(name: str, options: dict[str, Any]) -> tuple[str, str]:
    """("refused", field) for a ConfigError before any actor starts; ("ran", "") for a run that
    finishes; ("aborted", why) for the protocol's own abort (BelowThreshold: too many dropouts,
    an outcome the run reports by design); otherwise ("slow" | "crashed", what happened)."""
    import signal

    from rayfed.api import _prepare, _reconcile, execute
    from rayfed.errors import BelowThreshold

    proto = get_protocol(name)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(_EDGE_RUN_S)
    try:
        try:  # every refusal comes here, before any actor or run directory
            _, run_opts, cfg = resolve(name, {**options, "backend": "local", "out_dir": None})
            cfg, run_opts = _reconcile(proto, cfg, run_opts)
            plan, faults, placement = _prepare(proto, cfg, run_opts)
        except ConfigError as err:
            return "refused", err.field
        execute(proto, cfg, run_opts, plan, faults, placement)
        return "ran", ""
    except BelowThreshold as err:
        return "aborted", str(err)
    except _Slow:
        return "slow", f"over {_EDGE_RUN_S} s"
    except Exception as err:  # noqa: BLE001 - the failure this check reports
        return "crashed", f"{type(err).__name__}: {err}"[:300]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _declaration(cls: type, option: str) -> tuple[Any, str]:
    """(the dataclass field of a dotted ``option``, the prefix of its group: ``population.``)."""
    head, _, rest = option.partition(".")
    f = {g.name: g for g in dataclasses.fields(cls)}[head]
    if not rest:
        return f, ""
    inner, prefix = _declaration(typing.get_type_hints(cls)[head], rest)
    return inner, f"{head}.{prefix}"


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _inapplicable(err: ConfigError) -> bool:
    """The refusal of an option the chosen mode or data source does not read
    (config.check_applicable), not of its value."""
    return err.problem.startswith(("does not apply", "applies to"))


def _dropped(options: dict[str, Any], dotted: str) -> dict[str, Any]:
    head, _, rest = dotted.partition(".")
    out = dict(options)
    if rest and isinstance(out.get(head), dict):
        out[head] = _dropped(out[head], rest)
    else:
        out.pop(head, None)
    return out


def _closest(name: str, options: dict[str, Any], keep: str) -> dict[str, Any]:
    """``options`` less the example's settings its new mode does not read (each refused as
    inapplicable, config.check_applicable), ``keep`` (the option under test) never dropped."""
    for _ in range(10):
        try:
            resolve(name, options)
        except ConfigError as err:
            if not _inapplicable(err) or err.field == keep:
                return options
            smaller = _dropped(options, err.field)
            if smaller == options:
                return options
            options = smaller
            continue
        return options
    return options


def _modes(name: str, option: str, edge: dict[str, Any]) -> list[dict[str, Any]]:
    """Each example with the mode that reads ``option`` set, from its ``when`` declaration (every
    combination of the modes it names), and the example's settings that mode does not read
    dropped: the closest run that reads the option (the examples are synthetic, so a
    ``source="synthetic"`` option needs nothing more)."""
    proto = get_protocol(name)
    f, prefix = _declaration(proto.Config, option)
    when = f.metadata.get("when", {})
    keys = sorted(when)
    out = []
    for example in proto.examples:
        for values in itertools.product(*(when[k] for k in keys)):
            modes: dict[str, Any] = {}
            for key, value in zip(keys, values, strict=True):
                modes = _merged(modes, _nested(prefix + key, value))
            out.append(_closest(name, _merged(_merged(example, modes), edge), option))
    return out


#: settings a mode needs on top of _SMALL's (protocol, mode option, mode): gd-dr's shuffling
#: amplification does not certify ε = 1 for _SMALL's users and δ (refused naming users, then
#: epsilon: 700 reporting users at δ = 1e-5 certify at most 0.84)
_MODE_NEEDS: dict[tuple[str, str, Any], dict[str, Any]] = {
    ("federated-mf", "method", "gd-dr"): {"users": 1000, "epsilon": 0.5},
}


def _shrunk(name: str, options: dict[str, Any]) -> dict[str, Any]:
    out = _small(name, options)
    for (protocol, key, mode), needs in _MODE_NEEDS.items():
        if protocol == name and options.get(key) == mode:
            out = _merged(out, needs)
    return out


#: (protocol, option): why no mode of the protocol can run the option at its edges here; the
#: never-run set is asserted equal to this, so a new gap fails and a closed one must be removed
_NEVER_RUN: dict[tuple[str, str], str] = {}
#: (protocol, option): the other options a run of the option at an edge may be refused naming,
#: where the edge conflicts with the example's other settings (the fix is in that option)
_CONFLICTS: dict[tuple[str, str], set[str]] = {
    # ε = 1e-9 with Skellam: 16 bits cannot hold the users' rounding errors at that scale
    ("federated-mf", "epsilon"): {"bits"},
    # 1 item: each user has a single rating, never held out, so no test set at any fraction
    ("federated-mf", "items"): {"test_fraction"},
    # ε = 1e-9 / ρ at its edges / 30 fraction bits: the fixed-point ring cannot hold the noise
    ("hfl-kmeans", "epsilon"): {"ring_bits"},
    ("hfl-kmeans", "rho"): {"ring_bits"},
    ("hfl-kmeans", "frac_bits"): {"ring_bits"},
    ("hfl-kmeans", "max_size"): {"min_size"},  # max_size = 1 below the example's min_size
    ("ldp-bitvector", "records"): {"k"},  # 2 records, fewer than k clusters
    ("pattern-count", "max_patterns"): {"patterns"},  # 1 pattern allowed, the example asks more
    # 2 users leave no threshold for the example's dropouts and corrupt clients; degree 2 is
    # below the example's threshold of 3
    ("secure-sum", "users"): {"threshold"},
    ("secure-sum", "degree"): {"threshold"},
    ("vfl-kmeans", "max_grid_cells"): {"k_prime"},  # a 1-cell grid: k' is too large
    ("vfl-kmeans", "users"): {"k"},  # 2 users, fewer than k clusters
    ("vfl-kmeans", "dims"): {"parties"},  # 1 attribute cannot be split over the parties
    ("vfl-primitives", "epsilon"): {"bound"},  # lp-moment (paper) at ε = 1e-9: bound too large
    ("vfl-primitives", "users"): {"k"},  # 1 user, fewer than k clusters
    ("vfl-primitives", "dims"): {"parties"},  # 1 attribute cannot be split over the parties
}


@pytest.mark.parametrize("name", PROTOCOLS)
def test_every_option_at_its_edges_runs_or_is_refused_naming_it(name):
    """Each option at the edges of its declared range (smallest and largest accepted value, just
    inside an open bound, 1e6 and 1e9 for an unbounded float) on the protocol's smallest example
    whose mode reads it (an example, else the closest example with the option's ``when`` modes
    set): the run finishes, or a ConfigError naming the option (or a dotted path under it, or one
    of the conflicting options _CONFLICTS lists for it) refuses it before any actor starts. No
    other exception, no run longer than a few seconds (slow is a failure of its own kind, not a
    pass). An option no mode can read at an edge must be listed in _NEVER_RUN, with why."""
    proto = get_protocol(name)
    bad, never = [], set()
    for option, value in _edge_cases(proto.Config):
        edge = _nested(option, value)
        allowed = {option} | _CONFLICTS.get((name, option), set())

        def names(field: str, allowed=allowed) -> bool:
            return any(field == a or field.startswith(a + ".") for a in allowed)

        usable = [e for e in proto.examples if _accepts(name, _merged(e, edge))]
        if not usable:  # no example's mode reads it: set the mode that does
            refusals = []
            for candidate in _modes(name, option, edge):
                try:
                    resolve(name, candidate)
                except ConfigError as err:
                    refusals.append(err)
                    continue
                usable = [candidate]
                break
            if not usable:
                read = [e for e in refusals if not _inapplicable(e)]
                if not read:  # no mode reads it: an explicit, reasoned gap
                    never.add(option)
                elif not names(read[0].field):  # every mode that reads it refuses the value
                    bad.append((option, value, "refused naming", read[0].field, read[0].problem))
                continue
        # the budget on every mode that reads it (each mode calibrates its own way), the rest on
        # the first
        for example in usable if option in _BUDGET else usable[:1]:
            kind, detail = _edge_outcome(name, _merged(_shrunk(name, example), edge))
            if kind in ("ran", "aborted") or (kind == "refused" and names(detail)):
                continue
            bad.append((option, value, example, kind, detail))
    assert not bad, bad
    assert never == {o for (n, o) in _NEVER_RUN if n == name}, never
