"""VFL/HFL DP-SGD's default learning rate is the public rule of the noise (rayfed/mf/rates.py,
issue 30): recomputed here from its formula and the plan's public fields, blind to the rating
values, and a user's rate wins."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayfed.config import from_mapping
from rayfed.errors import ConfigError
from rayfed.protocols import get_protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig

#: the rule's constants, written out (not imported): κ, c and the decay
KAPPA, C, DECAY = 1.3, 0.32, 0.1


def _ratings_file(path, values_seed: int):
    """A small ratings file: 60 users, 30 items, fixed (user, item) pairs; the rating values drawn
    from ``values_seed`` (the pairs never change with it)."""
    pairs = np.random.default_rng(0)
    rows = []
    for user in range(60):
        for item in pairs.choice(30, size=int(pairs.integers(4, 20)), replace=False):
            rows.append((user, int(item)))
    values = np.random.default_rng(values_seed).integers(1, 6, len(rows))
    path.write_text(
        "user_id,item_id,rating\n"
        + "".join(f"{u},{i},{r}\n" for (u, i), r in zip(rows, values, strict=True))
    )
    return str(path)


def _config(**options) -> FederatedMFConfig:
    """(the RDP accountant calibrates z in milliseconds; the rule reads whichever z it gets)"""
    private = options.get("noise") != "none"
    return from_mapping(
        FederatedMFConfig, {**({"accountant": "rdp"} if private else {}), **options}
    )


def _plan(**options):
    return get_protocol("federated-mf").plan(_config(**options), 0)


def _expected(plan, cfg: FederatedMFConfig, sensitivity: float, theta: int | None) -> float:
    """γ0 from the formula and the plan's parties: σ = zΔ·√(Σ(w_k/b_k)²), b_k = η·|Ω_k| (each
    user's training ratings at k capped at θ), γ0 = min(κ√(R/p)/(σ√(T·T')), c·min(n, m)/R); for
    VFL's local-only baseline, which averages nothing, σ = zΔ·√(mean_k b_k⁻²)."""
    params = plan.params
    local = cfg.method == "local"
    terms = []
    for name, (table, _meta) in plan.parties.items():
        train = table.filter(np.asarray(table.column("split").to_pylist()) == "train")
        users = train.column("user_id").to_numpy()
        count = np.minimum(np.unique(users, return_counts=True)[1], theta or 10**9).sum()
        weight = 1 / math.sqrt(len(plan.parties)) if local else params.shares[name]
        terms.append((weight / max(cfg.sampling_rate * count, 1.0)) ** 2)
    signal = C * min(params.n, params.m) / cfg.bound
    if params.z is None:
        return signal
    sigma = params.z * sensitivity * math.sqrt(sum(terms))
    steps = cfg.iterations * cfg.local_steps
    return min(KAPPA * math.sqrt(cfg.bound / cfg.rank) / (sigma * math.sqrt(steps)), signal)


@pytest.mark.parametrize(
    "options, theta",
    [
        ({"setting": "vfl", "parties": 3, "epsilon": 1.0}, None),
        ({"setting": "vfl", "parties": 2, "epsilon": 8.0, "privacy_unit": "user"}, 5),
        ({"setting": "hfl", "parties": 3, "epsilon": 2.0}, 10),
        ({"setting": "hfl", "parties": 2, "epsilon": 4.0, "privacy_unit": "rating"}, None),
        ({"setting": "vfl", "parties": 2, "noise": "none"}, None),
        ({"setting": "vfl", "method": "local", "parties": 3, "epsilon": 1.0}, None),
        ({"setting": "vfl", "method": "local", "parties": 2, "privacy_unit": "user"}, 5),
    ],
)
def test_the_default_rate_is_the_rule_of_the_public_fields(tmp_path, options, theta):
    options = {**options, "iterations": 20, "data": {"path": _ratings_file(tmp_path / "r.csv", 1)}}
    plan = _plan(**options)
    cfg = _config(**options)
    p = plan.params
    sensitivity = p.delta_joint if cfg.setting == "vfl" else p.delta_v
    expected = _expected(plan, cfg, sensitivity, theta)
    assert p.lr_source == "rule"
    assert p.lr == pytest.approx(expected, rel=1e-12)
    assert p.lr_end == pytest.approx(expected * DECAY, rel=1e-12)


def test_the_rule_reads_no_rating_value(tmp_path):
    """The same pairs with other rating values: the same rate to the last bit."""
    options = {"setting": "vfl", "parties": 3, "epsilon": 1.0, "privacy_unit": "user"}
    one = _plan(**options, data={"path": _ratings_file(tmp_path / "a.csv", 1)}).params
    two = _plan(**options, data={"path": _ratings_file(tmp_path / "b.csv", 2)}).params
    assert one.mean != two.mean  # the values did change
    assert (one.lr, one.lr_end) == (two.lr, two.lr_end)


def test_the_rule_falls_with_the_noise(tmp_path):
    path = {"path": _ratings_file(tmp_path / "r.csv", 1)}
    rates = [
        _plan(setting="vfl", parties=3, epsilon=e, data=path).params.lr for e in (0.5, 1, 4, 8)
    ]
    assert rates == sorted(rates) and rates[0] < rates[-1]


def test_a_given_rate_wins(tmp_path):
    path = {"path": _ratings_file(tmp_path / "r.csv", 1)}
    constant = _plan(setting="vfl", parties=2, epsilon=1.0, vfl_lr=0.3, data=path).params
    assert (constant.lr, constant.lr_end, constant.lr_source) == (0.3, None, "given")
    decay = _plan(setting="hfl", epsilon=1.0, vfl_lr=0.3, vfl_lr_end=0.1, data=path).params
    assert (decay.lr, decay.lr_end, decay.lr_source) == (0.3, 0.1, "given")
    end_only = _plan(setting="vfl", epsilon=1.0, vfl_lr_end=0.01, data=path).params
    assert end_only.lr_source == "rule" and end_only.lr_end == 0.01


def test_hfl_local_only_reports_no_rate(tmp_path):
    """HFL's local-only baseline runs no DP-SGD: no learning rate is reported."""
    import rayfed

    path = {"path": _ratings_file(tmp_path / "r.csv", 1)}
    kw = dict(backend="local", out_dir=None, iterations=1, local_steps=1, accountant="rdp")
    local = rayfed.run("federated-mf", setting="hfl", method="local", data=path, **kw).metrics
    hfl = rayfed.run("federated-mf", setting="hfl", data=path, **kw).metrics
    assert "learning_rate" not in local and hfl["learning_rate"]["source"] == "rule"


@pytest.mark.parametrize("field", ["vfl_lr", "vfl_lr_end"])
def test_a_rate_out_of_range_names_its_option(field):
    with pytest.raises(ConfigError, match=field):
        _config(setting="vfl", **{field: 2e4})
