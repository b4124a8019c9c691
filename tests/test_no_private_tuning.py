"""No run tunes on private data without a charge (issue 30, Deliver 2).

(a) Every tuning path — the repro job's C3 ``--tune``, the E8 benchmark's GD-DR and LFL γ, the E3
benchmark's per-method pick — picks the same knob when the private ratings' values are permuted
or replaced, their min or max moved included (same public shape: users, items, number of ratings;
the scale is the configuration's [1, R]): the pick is made on a synthetic stand-in of that shape,
and the stand-in's scores are the same on every perturbation. A mutant that picks by the private
training MSE moves only some picks here: E3's rate (0.05 on the data, 0.01 replaced or floored),
E8's LFL γ (0.5 on the data, 8 permuted or replaced); never C3's rate nor E8's GD-DR γ. The
stand-in's scores, identical on every perturbation, are what catch it on every path.
(b) A default run tunes nothing: the repro job without ``--tune`` never calls the tuner, and
its C3 runs take the public rule's rate (rayfed/mf/rates.py), the same whatever the values.
(c) The stand-in has the public shape exactly, and is the same array whatever the private values
(their min and max included: the scale is the configuration's, the rating column is never read).
"""

from __future__ import annotations

import importlib
import runpy
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from rayfed import api, mf
from rayfed.errors import ConfigError
from rayfed.protocols.federated_mf import ratings as ratings_data
from rayfed.protocols.federated_mf import tuning
from rayfed.protocols.federated_mf.plan import plan as federated_mf_plan

ROOT = Path(__file__).resolve().parents[1]


def _perturbed(tmp: Path, n: int, m: int, density: float) -> dict[str, Path]:
    """A low-rank ratings file (n users, m items, integer ratings 1..5) and perturbations of its
    values with the same public shape (users, items, number of ratings): permuted, replaced (all
    3: min and max move), every 5 replaced by 4 (the max moves) and floored at 2 (the min moves)."""
    r = mf.synthetic_ratings(n, m, density=density, rng=np.random.default_rng(3))
    values = np.rint(r.rating)
    assert values.min() == 1 and values.max() == 5
    out = {}
    for name, v in {
        "private": values,
        "permuted": np.random.default_rng(4).permutation(values),
        "replaced": np.full(len(values), 3.0),
        "no_fives": np.where(values == 5, 4.0, values),
        "floored": np.maximum(values, 2.0),
    }.items():
        out[name] = tmp / f"{name}-{n}.csv"
        pacsv.write_csv(pa.table({"user_id": r.user, "item_id": r.item, "rating": v}), out[name])
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """40 users, 25 items, 30 % observed."""
    return _perturbed(tmp_path_factory.mktemp("ratings"), 40, 25, 0.3)


@pytest.fixture(scope="module")
def many_users(tmp_path_factory) -> dict[str, Path]:
    """200 users (GD-DR's shuffle bound needs more than 16·log(4T/δ)), 20 items, 10 %."""
    return _perturbed(tmp_path_factory.mktemp("ratings"), 200, 20, 0.1)


def _module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _repro():
    return runpy.run_path(str(ROOT / "jobs" / "federated_mf_repro.py"))


def _repro_args(path: Path, tune: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        data=str(path),
        rounds=10,
        parties=2,
        accountant="rdp",
        seed=0,
        backend="local",
        secagg="dealer",
        tune=tune,
        lrs="0.05,0.5",
    )


def _same_pick(picks: dict[str, object]) -> None:
    assert len(set(map(repr, picks.values()))) == 1, picks


def test_repro_c3_tune_picks_the_same_rate_whatever_the_private_values(datasets):
    c3_point = _repro()["c3_point"]
    picks, scores = {}, {}
    for name, path in datasets.items():
        grid: list = []
        point = c3_point("vfl", 1e4, _repro_args(path, tune=True), grid)
        assert point["tuning"] == tuning.TUNING
        assert [g["vfl_lr"] for g in grid] == [0.05, 0.5]
        best = min(grid, key=lambda g: g["stand_in_test_mse"])
        assert point["vfl_lr"] == best["vfl_lr"]  # the run took the stand-in's pick
        picks[name] = point["vfl_lr"]
        scores[name] = [g["stand_in_test_mse"] for g in grid]
    _same_pick(picks)
    _same_pick(scores)  # the stand-in's scores too: it never saw a private value


def test_e8_gddr_and_lfl_picks_do_not_move_with_the_private_values(many_users):
    gddr = _module("federated_mf_gddr")
    picks, scores = {}, {}
    for name in ("private", "replaced"):  # (the slowest test: LFL at 200 users, so two of five)
        path = many_users[name]
        grid: list = []
        row = gddr.tuned_gddr(1.0, 0, [0.003, 0.3], [None], grid, data=path)
        lfl = gddr.tuned_lfl(1.0, 0, "0.5,8", grid, data=path)
        assert row["tuning"] == lfl["tuning"] == tuning.TUNING
        assert [(g["method"], g["lr"]) for g in grid] == [
            ("gd-dr", 0.003),
            ("gd-dr", 0.3),
            ("lfl", 0.5),
            ("lfl", 8.0),
        ]
        picks[name] = (row["lr"], lfl["lr"])
        scores[name] = [g["stand_in_test_mse"] for g in grid]
    _same_pick(picks)
    _same_pick(scores)  # GD-DR's pick does not move under a pick on the data: its scores do


def test_e3_baselines_pick_does_not_move_with_the_private_values(datasets, monkeypatch):
    baselines = _module("federated_mf_baselines")
    monkeypatch.setitem(baselines.GRIDS, "vfl", ("vfl_lr", (0.01, 0.05, 0.5)))
    options = baselines.options  # the RDP ledger (the tight one's first calibration takes 50 s)
    short = {"accountant": "rdp", "iterations": 20}  # and 20 rounds, not 100
    monkeypatch.setattr(baselines, "options", lambda *a, **k: {**options(*a, **k), **short})
    picks, stand_in = {}, {}
    for name in ("private", "replaced", "no_fives"):  # three of five: the file's time
        value, scores = baselines.pick("vfl", "rating", 8.0, data=datasets[name])
        assert [s["vfl_lr"] for s in scores] == [0.01, 0.05, 0.5]
        assert value == min(scores, key=lambda s: s["stand_in_test_mse"])["vfl_lr"]
        picks[name] = value
        stand_in[name] = [s["stand_in_test_mse"] for s in scores]
    _same_pick(picks)
    _same_pick(stand_in)


def test_a_default_run_tunes_nothing(datasets, monkeypatch):
    """The repro job's C3 without --tune: no call to the tuner, and the rate is the public rule's,
    the same on every perturbation of the data's values."""
    job = _repro()

    def refuse(*a, **k):
        raise AssertionError("a default run tuned")

    monkeypatch.setattr(tuning, "tune", refuse)
    rates = {}
    for name, path in datasets.items():
        args = _repro_args(path, tune=False)
        options = job["c3_options"]("vfl", 1e4, args)
        assert "vfl_lr" not in options and "vfl_lr_end" not in options
        point = job["c3_point"]("vfl", 1e4, args, grid := [])
        assert point["tuning"] is None and point["lr_source"] == "rule" and grid == []
        rates[name] = (point["vfl_lr"], point["vfl_lr_end"])
    _same_pick(rates)
    start, end = rates["private"]
    assert end == pytest.approx(start / 10)


def test_the_stand_in_is_the_same_whatever_the_private_values(datasets, tmp_path):
    """The stand-in made from every perturbation of the values is the same array: its scale is
    [1, R] from the configuration (not the data's min and max), and its shape is read from the
    user and item columns alone — a rating column out of [0, R] changes nothing (the run itself
    would refuse it later)."""
    private = mf.load_ratings(datasets["private"])
    files = dict(datasets)
    beyond = tmp_path / "beyond.csv"  # ratings 7 (> R = 5): never read, never refused here
    pacsv.write_csv(
        pa.table(
            {"user_id": private.user, "item_id": private.item, "rating": np.full(len(private), 7.0)}
        ),
        beyond,
    )
    files["beyond"] = beyond
    expected = ratings_data.PublicShape(40, 25, len(private), 1.0, 5.0)
    made = {}
    for name, path in files.items():
        opts = {"setting": "vfl", "data": {"path": str(path)}, "seed": 7}
        shape = tuning.public_shape(opts)
        assert shape == expected, name
        made[name] = ratings_data.stand_in(shape, 7)
    first = made["private"]
    for name, other in made.items():
        for col in ("user", "item", "rating"):
            assert np.array_equal(getattr(other, col), getattr(first, col)), (name, col)
        assert (other.n, other.m, other.low, other.high) == (40, 25, 1.0, 5.0), name
    # R from the configuration, not from the data
    opts = {"setting": "vfl", "data": {"path": str(files["no_fives"])}, "seed": 7, "bound": 4.5}
    assert tuning.public_shape(opts) == ratings_data.PublicShape(40, 25, len(private), 1.0, 4.5)
    opts["bound"] = 0.8  # R <= 1: the domain's low end
    assert tuning.public_shape(opts) == ratings_data.PublicShape(40, 25, len(private), 0.0, 0.8)


def test_the_stand_in_has_the_public_shape(datasets):
    private = mf.load_ratings(datasets["private"])
    shape = ratings_data.PublicShape(40, 25, len(private), 1.0, 5.0)
    stand_in = ratings_data.stand_in(shape, 7)
    assert (stand_in.n, stand_in.m, len(stand_in)) == (40, 25, len(private))
    assert np.all(np.bincount(stand_in.user, minlength=40) >= 1)
    assert np.all(np.bincount(stand_in.item, minlength=25) >= 1)
    assert 1.0 <= stand_in.rating.min() and stand_in.rating.max() <= 5.0
    cells = stand_in.user * 25 + stand_in.item
    assert np.unique(cells).size == cells.size
    again = ratings_data.stand_in(shape, 7)
    assert np.array_equal(again.rating, stand_in.rating)  # seeded, reproducible
    assert not np.array_equal(ratings_data.stand_in(shape, 8).rating, stand_in.rating)
    # the parties' split sizes follow from the shape and the seed: the stand-in's are the data's
    stand_in_path = datasets["private"].parent / "stand_in.csv"
    columns = {"user_id": stand_in.user, "item_id": stand_in.item, "rating": stand_in.rating}
    pacsv.write_csv(pa.table(columns), stand_in_path)
    shares = []
    for path in (datasets["private"], stand_in_path):
        _, run_opts, cfg = api.resolve(
            "federated-mf",
            setting="vfl",
            parties=3,
            noise="none",  # no calibration: the split is all that is compared
            data={"path": str(path)},
            seed=7,
        )
        params = federated_mf_plan(cfg, run_opts.seed).params
        shares.append((params.n, params.m, params.shares))
    assert shares[0] == shares[1]
    with pytest.raises(ConfigError, match="count"):
        mf.synthetic_ratings(4, 3, count=3, rng=np.random.default_rng(0))  # < max(n, m)


def test_the_stand_in_is_drawn_from_the_runs_own_seed(datasets, monkeypatch):
    """The tuner seeds the stand-in with the seed the run resolves (here given as ``sets``), as
    the public shape does, not with a ``seed`` key it may not have."""
    seeds = []

    class Drawn(Exception):
        pass

    def record(shape, seed):
        seeds.append(seed)
        raise Drawn

    monkeypatch.setattr(ratings_data, "stand_in", record)
    opts = {"setting": "vfl", "data": {"path": str(datasets["private"])}, "sets": ["seed=5"]}
    with pytest.raises(Drawn):
        tuning.tune(opts, [{"vfl_lr": 0.1}])
    assert seeds == [5]
