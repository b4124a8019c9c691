"""hfl-kmeans end to end (spec shared/specs/hfl-kmeans.md §3.5-§3.7, §6): the public arithmetic
(t_max, budget split, noise scales), the ledger, exactness of the masking modes, the
average-of-averages bias, the leakage invariants (transcript and step level), the thesis's
orderings and WCSS at ε = 4 on S1, Birch2 and Adult, bad input, and Ray == in-process.

The unit checks of the assignment, initialisations, folding and pads are in
test_hfl_kmeans_units.py. Data files come from the shared read-only folder; their declared bounds
are each column's min and max (the thesis's min-max normalisation). A run is a deterministic
function of its seed, so every statistical comparison uses fixed seeds and states the per-run
standard deviation its tolerance comes from.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed import rng
from rayfed.actors.base import StepContext
from rayfed.clustering import dplloyd, nearest
from rayfed.clustering.constrained import assign, cluster_sums, data_random, fold
from rayfed.errors import ConfigError, DataError
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig
from rayfed.protocols.hfl_kmeans.params import Settings, derive_setup
from rayfed.protocols.hfl_kmeans.steps import (
    aggregate_step,
    iterate_step,
    prepare_step,
    secure_input,
)
from rayfed.secagg import pads

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
S1 = DATA / "s1" / "s1.csv"
IRIS = DATA / "iris" / "iris.csv"
ADULT = DATA / "adult" / "adult_full.csv"
BIRCH2 = DATA / "birch2" / "birch2_sample25k.csv"
IRIS_COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
ADULT_COLUMNS = [
    "age",
    "fnlwgt",
    "education_num",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
]

# §3.7: dataset -> (N, d, k, ε^(m) NMA, ε^(m) AMN, t_max NMA, t_max AMN) at M = 2, E = 1, ρ = 0.225
EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0)
TABLE_3_7 = {
    "Image": (34112, 3, 3, 0.0257, 0.0265, [7, 7, 7, 7, 7], [7, 7, 7, 7, 7]),
    "House": (1837, 3, 3, 0.4772, 0.4920, [2, 2, 2, 4, 7], [2, 2, 2, 4, 7]),
    "Iris": (150, 4, 3, 8.4846, 9.1129, [2, 2, 2, 2, 2], [2, 2, 2, 2, 2]),
    "Adult": (48842, 6, 3, 0.0447, 0.0524, [5, 7, 7, 7, 7], [4, 7, 7, 7, 7]),
    "S1": (5000, 2, 15, 1.1783, 1.0984, [2, 2, 2, 2, 3], [2, 2, 2, 2, 3]),
    "Birch2": (25000, 2, 100, 4.0564, 3.7872, [2, 2, 2, 2, 2], [2, 2, 2, 2, 2]),
    "Synth": (5000, 2, 2, 0.0574, 0.0537, [4, 7, 7, 7, 7], [4, 7, 7, 7, 7]),
}
# §3.7: c_min, c_max and the per-client bounds at M = 2
SIZES_3_7 = {
    "Image": (7581, 34112, 3791, 17056),
    "House": (409, 1837, 205, 918),
    "Iris": (34, 150, 17, 75),
    "Adult": (10854, 48842, 5427, 24421),
    "S1": (223, 1000, 112, 500),
    "Birch2": (167, 750, 84, 375),
    "Synth": (1667, 7500, 834, 3750),
}


def _columns(path: Path, columns: list[str]) -> np.ndarray:
    table = pacsv.read_csv(path)
    return np.column_stack([table.column(c).to_numpy().astype(np.float64) for c in columns])


def file_options(path: Path, columns: list[str], k: int) -> dict:
    """data.path, k and the declared bounds: each column's min and max in the file."""
    x = _columns(path, columns)
    bounds = {c: [float(x[:, j].min()), float(x[:, j].max())] for j, c in enumerate(columns)}
    return {"data": {"path": str(path)}, "bounds": bounds, "k": k}


def s1(**options) -> dict:
    return file_options(S1, ["x", "y"], 15) | options


def run(seed: int = 0, **options):
    return rayfed.run("hfl-kmeans", backend="local", out_dir=None, seed=seed, **options)


def centroids(result, columns: list[str]) -> np.ndarray:
    table = result.tables["centroids"]
    return np.column_stack([table.column(c).to_numpy() for c in columns])


def mean_sd_se(values) -> tuple[float, float, float]:
    values = np.asarray(values, dtype=np.float64)
    sd = float(values.std(ddof=1))
    return float(values.mean()), sd, sd / math.sqrt(values.size)


# --- 1. public arithmetic: §3.7 and §6 check 2 -------------------------------------------------
@pytest.mark.parametrize("dataset", sorted(TABLE_3_7))
def test_table_3_7_sizes_epsilon_m_and_t_max(dataset):
    """Every entry of the §3.7 table: c_min, c_max, per-client bounds, ε^(m) of NMA and AMN to 4
    decimals and t_max at ε in (0.25, 0.5, 1, 2, 4)."""
    n, d, k, eps_nma, eps_amn, t_nma, t_amn = TABLE_3_7[dataset]
    bounds = dplloyd.size_bounds(n, k, 2)
    assert (bounds.c_min, bounds.c_max, bounds.client_min, bounds.client_max) == SIZES_3_7[dataset]
    nma = dplloyd.nma_epsilon_m(n, k, d)
    amn = dplloyd.amn_epsilon_m(bounds.c_min, k, d)
    assert round(nma, 4) == pytest.approx(eps_nma, abs=1e-12)
    assert round(amn, 4) == pytest.approx(eps_amn, abs=1e-12)
    assert [dplloyd.iterations(e, nma) for e in EPSILONS] == t_nma
    assert [dplloyd.iterations(e, amn) for e in EPSILONS] == t_amn
    # derive_setup applies the same rule (NMA and AMN) from N, d and the options, with the
    # thesis's noise (sensitivity=thesis); the corrected noise's rule is tested below
    for aggregation, expected in (("nma", t_nma), ("amn", t_amn)):
        for eps, t_max in zip(EPSILONS, expected, strict=True):
            cfg = HflKmeansConfig(k=k, epsilon=eps, aggregation=aggregation, sensitivity="thesis")
            assert derive_setup(cfg, n, d).t_max == t_max


@pytest.mark.parametrize("aggregation", ["nma", "amn"])
@pytest.mark.parametrize("assignment", ["constrained", "unconstrained", "non-exclusive"])
def test_default_iteration_rule_budgets_for_the_corrected_noise(aggregation, assignment):
    """Issue 30: with sensitivity=corrected (the default) the position block's noise is r = true
    Δ / thesis Δ times the thesis's. r from the sensitivity arguments in real units: NMA sums
    2k - 1 (constrained, E = 1), 2k/E = 2 (non-exclusive, E = k), 1 (unconstrained); AMN
    centroids ((k - 1)·2B/(M·C) + 2B/(M(C + 1))) / (B/c_min) (constrained, C = ⌈c_min/M⌉),
    k·2B/(M·C) / (k·B/c_min) (non-exclusive, E = k), and unconstrained AMN has no ε^(m)
    (t_max = 2). AMN's MSE is all centroid noise: the same MSE needs r·ε. NMA's counts keep the
    thesis's Δ, so under (6.1) with the split fixed (ε^Σ = ε^(t)/(d + c), ε^C = c·ε^(t)/(d + c),
    c = ∛(4dρ²), 4ρ² = c³/d) the MSE is ∝ (d + c)²(r²d + c)/ε^(t)² against the thesis's
    (d + c)³/ε^(t)²: the same MSE needs √((r²d + c)/(d + c))·ε (12.8 for r = 15, d = 2, not
    15). t_max = clip(ε/(factor·ε^(m)), 2, 7). The synthetic default (10,000 x 2, k = 8) then
    runs 2 iterations at ε = 0.5 to 8 where the thesis's rule ran 2, 4, 7, 7 and its NICV rose
    from ε = 0.5 to 1. A given iterations still wins."""
    n, d, k, m = 10_000, 2, 8, 2
    c_min = math.ceil(n / (1.5 * k))
    c = math.ceil(c_min / m)
    e = k if assignment == "non-exclusive" else 1
    if aggregation == "nma":
        thesis = dplloyd.nma_epsilon_m(n, k, d, e)
        r = {"constrained": 2 * k - 1, "non-exclusive": 2, "unconstrained": 1}[assignment]
        split = (4 * d * 0.225**2) ** (1 / 3)
        r = math.sqrt((r**2 * d + split) / (d + split))
    else:
        constrained = assignment != "unconstrained"
        thesis = dplloyd.amn_epsilon_m(c_min if constrained else 0, k, d, e)
        r = {
            "constrained": ((k - 1) * 2 / (m * c) + 2 / (m * (c + 1))) * c_min,
            "non-exclusive": (k * 2 / (m * c)) / (k / c_min),
            "unconstrained": 1.0,
        }[assignment]
    for eps in (0.5, 1.0, 4.0, 8.0):
        cfg = HflKmeansConfig(k=k, epsilon=eps, aggregation=aggregation, assignment=assignment)
        setup = derive_setup(cfg, n, d)
        if math.isinf(thesis):
            assert setup.epsilon_m == math.inf and setup.t_max == 2
            continue
        assert setup.epsilon_m == pytest.approx(
            r * thesis, rel=1e-2
        )  # the grid rounds each move up by 2^-f
        assert setup.t_max == int(min(max(eps / (r * thesis), 2), 7))
        if assignment == "constrained":
            assert setup.t_max == 2  # the default: the thesis's rule gave 7 at ε = 4 and 8
        given = HflKmeansConfig(k=k, epsilon=eps, aggregation=aggregation, iterations=5)
        assert derive_setup(given, n, d).t_max == 5


def test_split_constant_and_s1_split():
    """§6 check 2: ∛(4dρ²) = 0.7399 for d = 2; S1 NMA ε = 4 -> t_max = 3, ε^Σ = 0.4866,
    ε^C = 0.3600, and t_max·(d·ε^Σ + ε^C) = ε."""
    assert round(dplloyd.split_constant(2), 4) == pytest.approx(0.7399, abs=1e-12)
    eps_m = dplloyd.nma_epsilon_m(5000, 15, 2)
    t_max = dplloyd.iterations(4.0, eps_m)
    assert t_max == 3
    eps_sum, eps_count = dplloyd.nma_split(4.0, t_max, 2)
    assert (round(eps_sum, 4), round(eps_count, 4)) == (
        pytest.approx(0.4866, abs=1e-12),
        pytest.approx(0.3600, abs=1e-12),
    )
    assert t_max * (2 * eps_sum + eps_count) == pytest.approx(4.0, rel=1e-12)
    assert eps_count / eps_sum == pytest.approx(dplloyd.split_constant(2), rel=1e-12)


@pytest.mark.parametrize(
    "n,d,k,aggregation,expected",
    [  # §3.7 "Laplace scales at ε = 4" (real units; AMN with the thesis's Δ^μ = B·E/c_min)
        (5000, 2, 15, "nma", {"sums": 2.06, "counts": 2.78}),
        (5000, 2, 15, "amn", {"centroids": 0.0067}),
        (25000, 2, 100, "nma", {"sums": 1.37, "counts": 1.85}),
        (25000, 2, 100, "amn", {"centroids": 0.0060}),
        (150, 4, 3, "nma", {"sums": 2.47, "counts": 2.65}),
        (150, 4, 3, "amn", {"centroids": 0.059}),
    ],
)
def test_noise_scales_at_epsilon_4(n, d, k, aggregation, expected):
    """The per-entry Laplace scale b = Δ/ε of each noise block, in data units, is §3.7's within
    0.5 % (NMA: b_sum = B/ε^Σ, b_cnt = 1/ε^C; AMN: b_μ = (B/c_min)/ε^μ). The table's figures are
    rounded loosely: S1's b_sum = 1/0.4866 = 2.055 is printed 2.06."""
    cfg = HflKmeansConfig(k=k, aggregation=aggregation, sensitivity="thesis")
    params = derive_setup(cfg, n, d)
    scales = {b.key: b.scale / params.scale for b in params.noise}
    assert scales.keys() == expected.keys()
    for label, value in expected.items():
        assert scales[label] == pytest.approx(value, rel=5e-3), (label, scales)
    if aggregation == "nma":  # exactly B/ε^Σ and 1/ε^C of the thesis's split
        eps_sum, eps_count = dplloyd.nma_split(4.0, params.t_max, d)
        assert scales["sums"] == pytest.approx(1 / eps_sum, rel=1e-9)
        assert scales["counts"] == pytest.approx(1 / eps_count, rel=1e-9)


def test_run_reports_the_derived_parameters_on_s1():
    """Through a run (the server's derive_setup): S1 at ε = 4 has t_max = 3, the §3.7 bounds and
    split, 4·k(d+1)-byte uploads; AMN also t_max = 3, and ε = 1 gives t_max = 2 — with the
    thesis's noise (sensitivity=thesis), whose rule §3.7 tabulates. The default corrected noise
    (r = 2k - 1 = 29 on the sums, not the counts) gives ε^(m) = √((29²·2 + c)/(2 + c)) · 1.1783,
    c = ∛(4·2·0.225²) (24.8 · 1.1783), and t_max = 2."""
    m = run(**s1(epsilon=4.0, sensitivity="thesis")).metrics
    assert m["t_max"] == 3 and m["points"] == 5000 and m["dims"] == 2
    assert (m["c_min"], m["c_max"], m["client_min"], m["client_max"]) == SIZES_3_7["S1"]
    assert m["epsilon_m"] == pytest.approx(1.1783, abs=5e-5)
    assert (m["eps_sum"], m["eps_count"]) == (
        pytest.approx(0.4866, abs=5e-5),
        pytest.approx(0.3600, abs=5e-5),
    )
    assert m["upload_bytes"] == 4 * 15 * 3
    amn = run(**s1(aggregation="amn", sensitivity="thesis")).metrics
    assert amn["t_max"] == 3 and amn["eps_mu"] == pytest.approx(4.0 / (3 * 2), rel=1e-12)
    assert run(**s1(epsilon=1.0, sensitivity="thesis")).metrics["t_max"] == 2
    corrected = run(**s1(epsilon=4.0)).metrics
    assert corrected["t_max"] == 2
    split = (8 * 0.225**2) ** (1 / 3)
    factor = math.sqrt((29**2 * 2 + split) / (2 + split))
    assert factor == pytest.approx(24.78, abs=5e-3)
    assert corrected["epsilon_m"] == pytest.approx(factor * 1.1783, abs=factor * 5e-5)


# --- 2. ledger ----------------------------------------------------------------------------------
@pytest.mark.parametrize("aggregation", ["nma", "amn"])
@pytest.mark.parametrize("topology", ["server", "ring", "ring-split"])
def test_ledger_spends_exactly_the_declared_budget(aggregation, topology):
    """The ledger's total is the declared ε (pure DP, add/remove one): t_max charges in sequence
    (the server's noise, or the ring's split noise: one release per iteration whose event the
    last client carries), or on the ring with local noise one charge per client per iteration
    composed in parallel (each client's scope spends ε)."""
    eps = 2.5
    options = {"ring-split": dict(topology="ring", ring_noise="split", masking="pairwise")}.get(
        topology, dict(topology=topology)
    )
    result = run(seed=4, **s1(aggregation=aggregation, epsilon=eps, **options))
    p, t_max = result.privacy, result.metrics["t_max"]
    assert p.epsilon == pytest.approx(eps, rel=1e-9)
    assert p.budget_epsilon == eps and p.delta == 0.0
    assert p.accountant == "pure" and p.neighboring_relation == "add_or_remove_one"
    if topology != "ring":
        assert p.composition == "sequential"
        assert [e["round"] for e in p.entries] == list(range(1, t_max + 1))
        assert p.per_scope == {"clients": pytest.approx(eps, rel=1e-9)}
    else:
        assert p.composition == "parallel"
        assert len(p.entries) == 2 * t_max
        assert p.per_scope == {
            "p0": pytest.approx(eps, rel=1e-9),
            "p1": pytest.approx(eps, rel=1e-9),
        }
        assert any("M times the central noise" in note for note in p.notes)
    # every noisy release was charged, and only those (a broadcast is one row per receiver)
    noisy = {(r["round"], r["sender"]) for r in result.transcript.to_pylist() if r["dp_event"]}
    assert len(noisy) == len(p.entries)


def test_ledger_amn_thesis_sensitivity_records_the_true_epsilon():
    """AMN with sensitivity=thesis calibrates noise to Δ^μ = B/c_min = 1/223 per coordinate while
    one point's augmenting path replaces a point in up to k - 1 = 14 local clusters of
    ⌈c_min/M⌉ = 112 points (2B/(M·112) = 1/112: ⌊2^16/112⌋ + 1 = 586 grid units) and adds one to
    a 15th (1/113: 580): per coordinate 14·586 + 580 = 8784 units, so the noise buys
    ε = 4 · 8784 · 223/2^16 = 119.6, not the declared 4; a note says so."""
    result = run(seed=1, **s1(aggregation="amn", sensitivity="thesis", epsilon=4.0))
    p = result.privacy
    # one coordinate's true sensitivity on the grid, summed over the path's clusters
    true_grid = 14 * (math.floor(2**16 / 112) + 1) + math.floor(2**16 / 113) + 1
    assert true_grid == 8784
    expected = 4.0 * true_grid * 223 / 2**16
    assert p.epsilon == pytest.approx(expected, rel=1e-9)
    notes = [n for n in p.notes if "sensitivity=thesis" in n]
    assert len(notes) == 1 and "ε = 4" in notes[0] and f"{expected:.4g}" in notes[0]
    corrected = run(seed=1, **s1(aggregation="amn", epsilon=4.0)).privacy
    assert corrected.epsilon == pytest.approx(4.0, rel=1e-9)
    assert not any("sensitivity=thesis" in n for n in corrected.notes)


def test_noise_none_spends_nothing():
    """noise=none: no charge, no DP event in the transcript, a 'not private' report; t_max = 7."""
    result = run(**s1(noise="none"))
    p = result.privacy
    assert (p.epsilon, p.budget_epsilon, p.entries) == (0.0, 0.0, [])
    assert p.summary().startswith("no differential privacy")
    assert not any(r["dp_event"] for r in result.transcript.to_pylist())
    assert result.metrics["t_max"] == dplloyd.NON_PRIVATE_ITERATIONS
    assert any("noise=none: not private" in n for n in p.notes)


# --- 3. masking is exact ------------------------------------------------------------------------
@pytest.mark.parametrize("aggregation", ["nma", "amn"])
@pytest.mark.parametrize("noise", ["laplace", "none"])
def test_masking_modes_give_bit_identical_centroids(aggregation, noise):
    """§6 check 1 at run level (Iris, constrained): the shared-seed pads and the pairwise masks
    cancel exactly in Z_2^32, so shared-seed, pairwise and none give the same centroids bit for
    bit (same seed, so the same noise). The float-Lloyd check below covers S1."""
    iris = file_options(IRIS, IRIS_COLUMNS, 3)
    tables = [
        run(seed=2, aggregation=aggregation, noise=noise, masking=m, **iris).tables["centroids"]
        for m in ("shared-seed", "pairwise", "none")
    ]
    assert tables[0].num_rows == 3
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])


def test_ring_width_does_not_change_the_result():
    """Z_2^32 and Z_2^64 decode to the same signed grid values: bit-identical centroids, with and
    without noise (the noise draws do not depend on the ring); S1 private, Iris without noise."""
    for noise, options in (("laplace", s1()), ("none", file_options(IRIS, IRIS_COLUMNS, 3))):
        a = run(seed=5, noise=noise, **options).tables["centroids"]
        b = run(seed=5, noise=noise, ring_bits=64, **options).tables["centroids"]
        assert a.equals(b)


@pytest.mark.parametrize(
    "path,columns,k,assignment,seed",
    [
        (S1, ["x", "y"], 15, "constrained", 0),
        (S1, ["x", "y"], 15, "constrained", 1),
        (S1, ["x", "y"], 15, "unconstrained", 3),
        (IRIS, IRIS_COLUMNS, 3, "constrained", 0),
        (IRIS, IRIS_COLUMNS, 3, "unconstrained", 0),
    ],
)
def test_masked_nma_without_noise_is_float_lloyd(path, columns, k, assignment, seed):
    """§6 check 1: masked NMA with noise=none equals plain float Lloyd within 1e-4 (observed
    <= 3e-6). The reference starts from the same initial centroids — init=data-random, k rows of
    the first client drawn by its 'init' stream — splits the rows in order (shuffle=False), assigns
    each block with the per-client bounds, and averages float sums (no grid, no ring).

    The constrained assignment is a min-cost flow whose ties the solver breaks: the grid's
    ~2^-16 differences can flip a near-tie (A22), which happened for S1 at seed 3 (3.6e-4), so the
    constrained S1 cases use seeds 0 and 1."""
    result = run(
        seed=seed,
        noise="none",
        init="data-random",
        shuffle=False,
        assignment=assignment,
        **file_options(path, columns, k),
    )
    x = _columns(path, columns)
    lo, hi = x.min(0), x.max(0)
    u = 2.0 * (x - lo) / (hi - lo) - 1.0
    cut = int(np.linspace(0, len(u), 3).round()[1])
    blocks = [u[:cut], u[cut:]]
    sizes = dplloyd.size_bounds(len(u), k, 2)
    centers = data_random(blocks[0], k, rng.stream(seed, "init", 0, "p0"))
    for _ in range(dplloyd.NON_PRIVATE_ITERATIONS):
        sums, counts = np.zeros((k, u.shape[1])), np.zeros(k)
        for block in blocks:
            rows, cols = assign(
                block,
                centers,
                assignment,
                min_size=sizes.client_min,
                max_size=sizes.client_max,
            )
            np.add.at(sums, cols, block[rows])
            np.add.at(counts, cols, 1.0)
        centers = fold(sums / np.maximum(counts, 0.5)[:, None], -1.0, 1.0)
    got = 2.0 * (centroids(result, columns) - lo) / (hi - lo) - 1.0
    assert np.abs(got - centers).max() < 1e-4


# --- 4. average of averages (check 14) ----------------------------------------------------------
def test_average_of_averages_bias(tmp_path):
    """Clients {2, 3} and {1, 2, 3} (shuffle=False, M = 2, k = 1, one iteration, no noise): AMN
    averages the local means, (2.5 + 2)/2 = 2.25; NMA divides the sums, 11/5 = 2.2."""
    path = tmp_path / "v.csv"
    path.write_text("v\n2\n3\n1\n2\n3\n")
    common = dict(
        data={"path": str(path)},
        bounds={"v": [0, 4]},
        k=1,
        clients=2,
        shuffle=False,
        assignment="unconstrained",
        noise="none",
        iterations=1,
    )
    amn = run(aggregation="amn", **common).tables["centroids"].column("v").to_pylist()
    nma = run(aggregation="nma", **common).tables["centroids"].column("v").to_pylist()
    assert amn == [pytest.approx(2.25, abs=1e-3)]
    assert nma == [pytest.approx(2.2, abs=1e-3)]


# --- 5. leakage invariants (check 13) -----------------------------------------------------------
@pytest.mark.parametrize(
    "aggregation,ring_bits,words",
    [("nma", 32, 15 * 3), ("amn", 32, 15 * 2), ("nma", 64, 15 * 3)],
)
def test_transcript_server_sees_only_masked_uploads(aggregation, ring_bits, words):
    """In iteration rounds every message to the coordinator is a masked_upload of exactly k(d+1)
    (NMA) or k·d (AMN) ring words — 4 or 8 bytes each (numpy nbytes) — and the coordinator sends
    the parties nothing but masked_aggregate of the same size; in setup it sends only the
    public parameters. Each client uploads once per iteration."""
    result = run(seed=3, **s1(aggregation=aggregation, ring_bits=ring_bits))
    t_max = result.metrics["t_max"]
    rows = result.transcript.to_pylist()
    size = words * ring_bits // 8
    assert result.metrics["upload_bytes"] == size
    to_server = [r for r in rows if r["receiver"] == "coordinator" and r["round"] >= 1]
    assert {r["name"] for r in to_server} == {"masked_upload"}
    assert all(r["bytes"] == size for r in to_server)
    assert sorted((r["round"], r["sender"]) for r in to_server) == [
        (t, p) for t in range(1, t_max + 1) for p in ("p0", "p1")
    ]
    from_server = [r for r in rows if r["sender"] == "coordinator"]
    assert {r["name"] for r in from_server if r["round"] >= 1} == {"masked_aggregate"}
    assert all(r["bytes"] == size for r in from_server if r["round"] >= 1)
    assert {r["name"] for r in from_server if r["round"] == 0} == {"parameters"}
    # over the whole run the server receives only the masked uploads (N is a public input)
    assert {r["name"] for r in rows if r["receiver"] == "coordinator"} == {"masked_upload"}


def test_ring_topology_never_involves_the_server():
    """topology=ring: after setup no message goes to or from the coordinator (here none at all:
    the first client broadcasts the public parameters); each iteration passes ring_partial
    messages of 4·k(d+1) bytes around the ring and p0 releases the sum."""
    result = run(seed=1, **s1(topology="ring"))
    t_max = result.metrics["t_max"]
    rows = result.transcript.to_pylist()
    assert not [
        r for r in rows if r["round"] >= 1 and "coordinator" in (r["sender"], r["receiver"])
    ]
    assert not [r for r in rows if "coordinator" in (r["sender"], r["receiver"])]
    parameters = [r for r in rows if r["name"] == "parameters"]
    assert {r["sender"] for r in parameters} == {"p0"}
    partials = [r for r in rows if r["name"] == "ring_partial"]
    assert sorted((r["round"], r["sender"], r["receiver"]) for r in partials) == [
        (t, a, b) for t in range(1, t_max + 1) for a, b in (("p0", "p1"), ("p1", "p0"))
    ]
    assert all(r["bytes"] == 4 * 15 * 3 and r["dp_event"] for r in partials)


def test_ring_pairwise_masks_cancel():
    """topology=ring with masking=pairwise (3 clients, no noise): the uploads go through the one
    secure sum over the parties (a masked input per client per iteration, no ring hop), whose
    masks cancel, so the centroids equal those of the ring padded by the first client."""
    options = file_options(IRIS, IRIS_COLUMNS, 3) | dict(noise="none", topology="ring", clients=3)
    padded = run(seed=2, **options)
    pairwise = run(seed=2, masking="pairwise", **options)
    assert padded.tables["centroids"].equals(pairwise.tables["centroids"])
    rows = pairwise.transcript.to_pylist()
    assert not [r for r in rows if r["name"] == "ring_partial"]
    masked = [r for r in rows if r["name"] == "masked_input"]
    assert sorted({r["sender"] for r in masked}) == ["p0", "p1", "p2"]
    assert len(masked) == 3 * pairwise.metrics["t_max"]


GROUP_KEY = bytes(range(32))


def _client_contexts(blocks: list[np.ndarray], cfg: HflKmeansConfig):
    """Client StepContexts holding ``blocks`` (already in [-1, 1]^d), prepared with the public
    parameters the server would derive, and a group key the server lacks."""
    n, d = sum(len(b) for b in blocks), blocks[0].shape[1]
    params = derive_setup(cfg, n, d)
    settings = Settings.of(cfg)
    order = [f"p{i}" for i in range(len(blocks))]
    meta = {"columns": [f"c{j}" for j in range(d)], "lo": [-1.0] * d, "hi": [1.0] * d}
    contexts = []
    for name, block in zip(order, blocks, strict=True):
        table = pa.table({f"c{j}": block[:, j] for j in range(d)})
        ctx = StepContext(name=name, role="party", seed=7, table=table, meta=meta)
        ctx.state["group_key"] = GROUP_KEY
        prepare_step(ctx, params, None, settings=settings, order=order)
        contexts.append(ctx)
    return contexts, params


def _one_iteration(contexts, params):
    """Uploads of iteration 1, the server's aggregate, and what a client decodes from it."""
    uploads = {c.name: iterate_step(c, None, t=1) for c in contexts}
    server = StepContext(name="coordinator", role="coordinator", seed=7)
    reply = aggregate_step(server, {n: m.payload for n, m in uploads.items()}, setup=params, t=1)
    pad_key = pads.subkey(GROUP_KEY, pads.INFO_PADS)
    r = pads.shared_pads(pad_key, 1, len(contexts), params.length, params.ring_bits).sum(
        axis=0, dtype=pads.ring_dtype(params.ring_bits)
    )
    decoded = pads.from_ring(reply.payload - r, params.ring_bits)
    return uploads, reply, decoded


def test_split_ring_noise_is_m_over_h_central_noises():
    """ring_noise=split, M = 3, h = 2 (the majority), pairwise masks: around the ring the release
    minus the clients' values is, per block, M/h = 1.5 times the variance of DLap(a), 2r/(1-r)²
    with r = e^(-ε/Δ) (4 sd of the sample variance, from the fourth moment); 400 rounds of
    fresh shares on fixed values."""
    cfg = HflKmeansConfig(
        topology="ring",
        ring_noise="split",
        masking="pairwise",
        clients=3,
        k=3,
        epsilon=1.0,
        assignment="unconstrained",
    )
    contexts, params = _client_contexts(_blocks(3, (200, 200, 200)), cfg)
    assert params.honest == 2
    for ctx in contexts:
        assert iterate_step(ctx, None, t=1) is None  # the secure sum takes this iteration's values
    held = [ctx.state["values"] for ctx in contexts]
    values = sum(held)
    noise = []
    for t in range(1, 401):  # the secure sum's release: its inputs' sum mod 2^b (masks cancel)
        release = secure_sum_inputs(contexts, held, t)
        noise.append(pads.from_ring(release, params.ring_bits) - values)
    noise = np.asarray(noise, dtype=np.float64)
    start = 0
    for block in params.noise:
        z = noise[:, start : start + block.length].ravel()
        r = math.exp(-block.epsilon / block.l1_sensitivity)
        var = 3 / 2 * 2 * r / (1 - r) ** 2
        sd = math.sqrt((np.mean(z**4) - var**2) / z.size)
        assert abs(np.mean(z**2) - var) < 4 * sd, (block.label, np.mean(z**2) / var)
        start += block.length


def secure_sum_inputs(contexts, held, t: int) -> np.ndarray:
    """The sum mod 2^b of the clients' secure-sum uploads (``secure_input``) of iteration t: what
    the one secure sum releases (its masks cancel; tests/test_secagg*.py check the sum itself)."""
    total = None
    for i, (ctx, values) in enumerate(zip(contexts, held, strict=True)):
        ctx.state["values"] = values
        out = secure_input(ctx, t, np.array([i]), t)
        words = (out[0] if isinstance(out, tuple) else out).words[0]  # RingWords, one row
        total = words if total is None else total + words
    return total


def _blocks(seed: int, sizes: tuple[int, ...], d: int = 2) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)
    centers = gen.uniform(-0.7, 0.7, (3, d))
    out = []
    for size in sizes:
        labels = gen.integers(0, 3, size)
        out.append(np.clip(centers[labels] + gen.normal(0, 0.1, (size, d)), -1, 1))
    return out


def test_step_level_nma_client_recovers_exact_sums_and_counts():
    """Table 5.2 with the noise off: decoding the masked aggregate gives exactly the union's
    per-cluster sums S_i (of grid-rounded points) and counts C_i (x 2^f) under the clients'
    nearest assignment to the shared initial centroids; the next centroids are S_i/C_i. The
    server's uploads and aggregate are not the plaintext."""
    blocks = _blocks(11, (137, 201))
    cfg = HflKmeansConfig(k=3, noise="none", assignment="unconstrained", iterations=1)
    contexts, params = _client_contexts(blocks, cfg)
    start = contexts[0].state["centers"]
    assert all(np.array_equal(c.state["centers"], start) for c in contexts[1:])
    uploads, reply, decoded = _one_iteration(contexts, params)
    assert all(m.name == "masked_upload" and m.to == "coordinator" for m in uploads.values())
    assert reply.name == "masked_aggregate" and reply.to == "parties" and reply.dp_event is None

    union = np.vstack(blocks)
    grid = np.rint(union * 2**16).astype(np.int64)
    labels = nearest(union, start)
    true_sums, true_counts = cluster_sums(grid, (np.arange(len(union)), labels), 3)
    assert decoded[:6].reshape(3, 2).tolist() == true_sums.tolist()
    assert decoded[6:].tolist() == (true_counts * 2**16).tolist()
    plain = pads.to_ring(decoded, 32)
    assert not np.array_equal(reply.payload, plain)
    for ctx, upload in zip(contexts, uploads.values(), strict=True):
        own_labels = nearest(ctx.state["x"], start)
        own = cluster_sums(ctx.state["xq"], (np.arange(len(ctx.state["x"])), own_labels), 3)
        own_plain = pads.to_ring(np.concatenate([own[0].ravel(), own[1] * 2**16]), 32)
        assert not np.array_equal(upload.payload, own_plain)
    # the client's update from the aggregate: S_i / C_i (within the domain: no fold)
    final = iterate_step(contexts[0], reply.payload, t=2)
    assert final.name == "centroids"
    expected = true_sums / 2**16 / true_counts[:, None]
    np.testing.assert_allclose(final.payload, expected, rtol=1e-12, atol=1e-12)


def test_step_level_amn_aggregate_hides_counts():
    """Table 5.3: the AMN aggregate is k·d words of Σ_l (local centroid)/M and carries no counts —
    a client whose rows are all doubled (every C_li doubles) yields the same decoded aggregate,
    while the NMA aggregate's count block changes."""
    blocks = _blocks(12, (90, 160))
    doubled = [blocks[0], np.vstack([blocks[1], blocks[1]])]
    decoded, start = {}, None
    for aggregation in ("amn", "nma"):
        cfg = HflKmeansConfig(
            k=3, noise="none", assignment="unconstrained", iterations=1, aggregation=aggregation
        )
        for name, data in (("plain", blocks), ("doubled", doubled)):
            contexts, params = _client_contexts(data, cfg)
            start = contexts[0].state["centers"]  # sphere packing from the group key: all same
            decoded[aggregation, name] = _one_iteration(contexts, params)[2]
    assert decoded["amn", "plain"].size == 3 * 2
    assert np.array_equal(decoded["amn", "plain"], decoded["amn", "doubled"])
    # the decoded values are the mean of the two local centroids, on the 2^-16 grid
    local = []
    for block in blocks:
        sums, counts = cluster_sums(block, (np.arange(len(block)), nearest(block, start)), 3)
        # an empty local cluster uploads the previous centroid (A9); one occurs here (p0)
        local.append(np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], start))
    np.testing.assert_allclose(
        decoded["amn", "plain"].reshape(3, 2) / 2**16, (local[0] + local[1]) / 2, atol=2.0**-15
    )
    counts_plain, counts_doubled = decoded["nma", "plain"][6:], decoded["nma", "doubled"][6:]
    assert counts_doubled.sum() == counts_plain.sum() + 160 * 2**16


def test_nma_without_noise_is_the_nearest_assignment_mean():
    """Run level: NMA, noise=none, unconstrained, one iteration on S1 outputs Σ x / C over the
    union's nearest-centroid partition (sums of grid-rounded points) to the initial centroids —
    init=data-random, reproduced from the first client's 'init' stream; rows split in order."""
    options = s1(noise="none", init="data-random", assignment="unconstrained", iterations=1)
    result = run(seed=6, shuffle=False, **options)
    x = _columns(S1, ["x", "y"])
    lo, hi = x.min(0), x.max(0)
    u = 2.0 * (x - lo) / (hi - lo) - 1.0
    start = data_random(u[:2500], 15, rng.stream(6, "init", 0, "p0"))
    labels = nearest(u, start)
    grid = np.rint(u * 2**16)
    sums, counts = cluster_sums(grid, (np.arange(len(u)), labels), 15)
    expected = sums / 2**16 / np.maximum(counts, 0.5)[:, None]
    got = 2.0 * (centroids(result, ["x", "y"]) - lo) / (hi - lo) - 1.0
    np.testing.assert_allclose(got, expected, atol=1e-9)


# --- 6-9. the thesis's orderings and magnitudes -------------------------------------------------
@pytest.mark.slow
def test_amn_unconstrained_private_is_catastrophic():
    """§6 check 6, S1 ε = 4: unconstrained AMN has Δ^μ = B per coordinate; WCSS several times the
    constrained AMN's with the thesis's noise (sensitivity=thesis: the faithful reproduction).
    Observed over seeds 0-4: 413 ± 62 against 79 ± 33 ([ref-sim] 459 vs 83); the paired ratios
    on seeds 0-2 are 9.4, 11.0 and 4.0 (3.0 at the worst of seeds 0-4), so we require a mean
    ratio > 3 and none below 2."""
    seeds = range(3)
    unconstrained = [
        run(seed=s, **s1(aggregation="amn", assignment="unconstrained")) for s in seeds
    ]
    constrained = [
        run(seed=s, **s1(aggregation="amn", sensitivity="thesis")).metrics["wcss"] for s in seeds
    ]
    wcss = np.array([r.metrics["wcss"] for r in unconstrained])
    assert all(r.metrics["t_max"] == 2 for r in unconstrained)  # ε^(m) = ∞ without c_min
    ratio = wcss / np.array(constrained)
    assert ratio.mean() > 3.0 and ratio.min() > 2.0, ratio


S1_THESIS = {"nma": 82.8, "amn-thesis": 81.7}  # Tables 8.2 / 8.3, (none, none, fold) and fold


@pytest.mark.slow
def test_s1_constrained_private_wcss_near_the_thesis():
    """§6 check 4 on S1 at ε = 4 over 12 seeds, the thesis's noise (sensitivity=thesis, the
    faithful mode): mean WCSS of constrained NMA near the thesis's 82.8 and of AMN near 81.7.
    Observed (seeds 0-11): NMA 88.1 ± 27.5,
    AMN 86.4 ± 26.9 (per-run sd is dominated by the sphere-packing start, [ref-sim] 82.5 ± 18.5);
    tolerance = max(10 % of the thesis value, 3 standard errors)."""
    seeds = range(12)
    runs = {
        "nma": [run(seed=s, **s1(sensitivity="thesis")).metrics["wcss"] for s in seeds],
        "amn-thesis": [
            run(seed=s, **s1(aggregation="amn", sensitivity="thesis")).metrics["wcss"]
            for s in seeds
        ],
    }
    for name, values in runs.items():
        mean, sd, se = mean_sd_se(values)
        target = S1_THESIS[name]
        tol = max(0.1 * target, 3 * se)
        which = "10% of the thesis value" if tol == 0.1 * target else "3 standard errors"
        assert abs(mean - target) < tol, (
            f"{name}: mean {mean:.1f} (sd {sd:.1f}, se {se:.1f}) vs thesis {target}: "
            f"tolerance {tol:.1f} = {which}"
        )


@pytest.mark.slow
def test_birch2_empty_clusters():
    """§6 check 5, Birch2 (k = 100), 2 seeds each: constrained private NMA at ε = 4 with the
    thesis's noise (sensitivity=thesis) leaves <= 2 empty clusters on average (observed 1, 0;
    thesis ≈ 1), the unconstrained non-private baseline >= 10 (observed 18, 17; thesis ≈ 15)."""
    options = file_options(BIRCH2, ["x", "y"], 100)
    private = [run(seed=s, sensitivity="thesis", **options).metrics for s in range(2)]
    baseline = [
        run(seed=s, noise="none", assignment="unconstrained", **options).metrics for s in range(2)
    ]
    empty_private = np.mean([m["empty_clusters"] for m in private])
    empty_baseline = np.mean([m["empty_clusters"] for m in baseline])
    assert empty_private <= 2, [m["empty_clusters"] for m in private]
    assert empty_baseline >= 10, [m["empty_clusters"] for m in baseline]
    assert empty_private + 5 < empty_baseline
    # WCSS near the thesis's 45.7: observed 56.1, 42.0 (49.8 at seed 2: sd ≈ 7), bound 68.6
    assert np.mean([m["wcss"] for m in private]) < 1.5 * 45.7


@pytest.mark.slow
def test_adult_constrained_private_beats_unconstrained_nonprivate():
    """§6 check 8, Adult (k = 3, Z_2^64): constrained private NMA at ε = 4 with the thesis's noise
    (sensitivity=thesis) has lower WCSS than the unconstrained non-private baseline, paired by seed (same data split and initialisation).
    Measured over seeds 0-7: private 11976 ± 293 (sd; the balanced assignment is stable),
    baseline 12733 ± 897, and every paired difference > 0 (9, 14, 47, 122, 873, 1313, 1550,
    2015). On seeds 0-3 the paired differences have mean 1062 and standard error 410, so the
    mean gap must exceed 2 se, and no seed may favour the baseline ([ref-sim]: 12064 vs 14549)."""
    options = file_options(ADULT, ADULT_COLUMNS, 3) | {"ring_bits": 64}
    seeds = range(4)
    private = np.array(
        [run(seed=s, sensitivity="thesis", **options).metrics["wcss"] for s in seeds]
    )
    baseline = np.array(
        [
            run(seed=s, noise="none", assignment="unconstrained", **options).metrics["wcss"]
            for s in seeds
        ]
    )
    gap = baseline - private
    assert gap.mean() > 2 * gap.std(ddof=1) / np.sqrt(len(gap)), (private, baseline)
    assert (gap > 0).all(), (private, baseline)


# --- 10. bad input ------------------------------------------------------------------------------
BAD_INPUT = {
    "init": (dict(init="kmeans++"), "init"),
    "init-data-random": (dict(init="data-random"), "init"),
    "clients": (dict(clients=1), "clients"),
    "contribution-above-k": (dict(contribution=16), "contribution"),
    "contribution-unconstrained": (
        dict(contribution=2, assignment="unconstrained"),
        "contribution",
    ),
    "sensitivity-nonprivate": (dict(noise="none", sensitivity="thesis"), "sensitivity"),
    "ring-noise-server": (dict(ring_noise="split"), "ring_noise"),
    "honest-local-ring": (dict(topology="ring", honest_clients=1), "honest_clients"),
    "honest-above-clients": (
        dict(topology="ring", ring_noise="split", honest_clients=3),
        "honest_clients",
    ),
    "honest-all-clients": (  # a client knows its own share: h = M leaves it (M-1)/M of the noise
        dict(topology="ring", ring_noise="split", masking="pairwise", honest_clients=2),
        "honest_clients",
    ),
    "split-first-client-pad": (dict(topology="ring", ring_noise="split"), "masking"),
    "mpc-first-client-pad": (dict(topology="ring", ring_noise="mpc"), "masking"),
    "mpc-server": (dict(ring_noise="mpc", masking="pairwise"), "ring_noise"),
    "mpc-plaintext": (dict(topology="ring", ring_noise="mpc", masking="none"), "masking"),
    "honest-zero": (dict(topology="ring", ring_noise="split", honest_clients=0), "honest_clients"),
    "min-size": (dict(min_size=400), "min_size"),  # 15 x 200 > 2,500 rows per client
    "ring-bits-48": (dict(ring_bits=48), "ring_bits"),
    "min-above-max": (dict(min_size=300, max_size=200), "min_size"),
    "non-exclusive-empty": (dict(assignment="non-exclusive", min_size=0), "min_size"),
    "non-exclusive-too-big": (dict(assignment="non-exclusive", min_size=6000), "min_size"),
    "unread-sum-post-amn": (dict(aggregation="amn", sum_post="fold"), "sum_post"),
    # truncation puts two centroids on one point: the flow's costs tie (test_hfl_kmeans_ties)
    "trunc-centroids-constrained": (dict(centroid_post="trunc"), "centroid_post"),
    "trunc-sums-and-counts-constrained": (dict(sum_post="trunc", count_post="trunc"), "sum_post"),
    "unread-rho-amn": (dict(aggregation="amn", rho=0.3), "rho"),
    "unread-epsilon-nonprivate": (dict(noise="none", epsilon=1.0), "epsilon"),
    "unread-min-size-unconstrained": (dict(assignment="unconstrained", min_size=10), "min_size"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_option_names_its_field(case):
    options, field = BAD_INPUT[case]
    with pytest.raises(ConfigError) as err:
        run(**s1(**options))
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_ring_bits_32_on_adult_overflows_with_the_limit_stated():
    """Adult's clusters can hold 48,842 points: Z_2^32 at 2^-16 holds values below 32,768."""
    with pytest.raises(ConfigError) as err:
        run(**file_options(ADULT, ADULT_COLUMNS, 3))
    assert err.value.field == "ring_bits"
    assert "32,768" in str(err.value) and "ring_bits=64" in str(err.value)


def test_data_file_without_bounds():
    with pytest.raises(ConfigError) as err:
        run(data={"path": str(S1)}, k=15)
    assert err.value.field == "bounds"


def test_bounds_column_not_in_the_file():
    options = s1()
    options["bounds"] = options["bounds"] | {"z": [0.0, 1.0]}
    with pytest.raises(DataError) as err:
        run(**options)
    assert err.value.field == "bounds.z"
    assert "'z'" in str(err.value)


def test_data_columns_is_rejected():
    options = s1()
    options["data"] = options["data"] | {"columns": {"p0": ["x"], "p1": ["y"]}}
    with pytest.raises(ConfigError) as err:
        run(**options)
    assert err.value.field == "data.columns"


# --- 11. Ray == in-process ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("topology", ["server", "ring"])
def test_ray_equals_local(ray_cluster, topology):
    """The same seed gives the same centroids and ledger on Ray actors and in-process (synthetic
    data, NMA with shared-seed masks; and the serverless ring)."""
    options = dict(users=2000, k=4, seed=8, topology=topology, masking="shared-seed")
    on_ray = rayfed.run("hfl-kmeans", out_dir=None, **options)
    local = rayfed.run("hfl-kmeans", backend="local", out_dir=None, **options)
    assert on_ray.tables["centroids"].num_rows == 4
    assert on_ray.tables["centroids"].equals(local.tables["centroids"])
    assert on_ray.privacy.epsilon == local.privacy.epsilon == pytest.approx(4.0, rel=1e-9)
    assert on_ray.transcript.select(["round", "sender", "receiver", "name", "bytes"]).equals(
        local.transcript.select(["round", "sender", "receiver", "name", "bytes"])
    )


# --- 12. initialisations ------------------------------------------------------------------------
@pytest.mark.parametrize("init", ["kmeans++", "data-random"])
def test_data_driven_init_without_noise(init):
    """init=kmeans++ / data-random (noise=none only): k centroids inside the declared bounds,
    S1 clustered about as well as non-private Lloyd does (WCSS < 150; constrained non-private
    [ref-sim] 75.6 ± 12.4); the first client sends its initial centroids to the clients only."""
    result = run(seed=2, **s1(noise="none", init=init))
    table = result.tables["centroids"]
    assert table.column("cluster").to_pylist() == list(range(15))
    bounds = s1()["bounds"]
    for col in ("x", "y"):
        values = table.column(col).to_numpy()
        assert (values >= bounds[col][0]).all() and (values <= bounds[col][1]).all()
    assert result.metrics["wcss"] < 150
    sent = [r for r in result.transcript.to_pylist() if r["name"] == "initial_centroids"]
    assert {r["sender"] for r in sent} == {"p0"}
    assert {r["receiver"] for r in sent} == {"p1"}  # no self-send recorded (issue 26, item 5)
    assert all(r["bytes"] == 8 * 15 * 2 for r in sent)


def test_random_init_differs_from_sphere_packing():
    """init=random (uniform in [-1, 1]^d from the shared seed) and sphere packing start from
    different centroids, so the same seed (same noise) gives different results."""
    packing = run(seed=3, **s1())
    random_ = run(seed=3, **s1(init="random"))
    a, b = centroids(packing, ["x", "y"]), centroids(random_, ["x", "y"])
    assert not np.allclose(a, b)
    assert packing.privacy.epsilon == random_.privacy.epsilon == pytest.approx(4.0, rel=1e-9)


@pytest.mark.slow
def test_repro_job_small(run_small_job):
    """jobs/hfl_kmeans_repro.py --small writes every section's rows, its checks and a plot."""
    out = run_small_job("hfl_kmeans_repro.py", timeout=600)
    record = json.loads((out / "hfl_kmeans_repro.json").read_text())
    assert set(record["sections"]) == {"table", "curves", "init"}
    table = record["sections"]["table"]
    assert {r["dataset"] for r in table} == {"s1", "iris"}
    assert all(r["runs"] == 2 for r in table)
    # The full job's 100 runs per cell put the per-run sd at about 20 on S1 (WCSS ≈ 84) and 6 on
    # Iris (≈ 35), so a mean of 2 runs has a standard error of 14 and 4: ±50 % of the thesis's
    # number is > 3 se on both, and a broken protocol (unconstrained AMN: 433 on S1) is far out.
    for r in table:
        if "thesis" in r:
            assert abs(r["wcss"] / r["thesis"] - 1) < 0.5, r
    assert any(r["epsilon_spent"] > 7 for r in table)  # AMN with the thesis's sensitivity
    assert record["checks"]["check 6: s1 AMN unconstrained private ≫ constrained"] is True
    assert all(Path(p).exists() for p in record["plots"])


def test_too_few_synthetic_points_name_users():
    with pytest.raises(DataError) as err:
        rayfed.run("hfl-kmeans", backend="local", out_dir=None, users=5, k=3)
    assert err.value.field == "users"


def test_each_assignment_charges_what_one_point_moves():
    """Against the unconstrained assignment (one point moves its own cluster: Δ^Σ = B per
    coordinate, Δ^C = 1): a non-exclusive cluster keeps its size, so a point can swap one in
    each of the k = 4 clusters (2k = 8 times the sums, k = 4 the counts); the constrained flow's
    augmenting path moves up to k - 1 = 3 other points (2k - 1 = 7 times the sums, counts 1)."""
    base = dict(k=4, users=2000, backend="local", out_dir=None)
    metrics = {
        a: rayfed.run("hfl-kmeans", assignment=a, **base).metrics
        for a in ("unconstrained", "non-exclusive", "constrained")
    }
    # scale x ε per entry is the sensitivity per coordinate (each assignment has its own t_max)
    sums = {a: m["noise_scales"]["sums"] * m["eps_sum"] for a, m in metrics.items()}
    counts = {a: m["noise_scales"]["counts"] * m["eps_count"] for a, m in metrics.items()}
    assert sums["unconstrained"] == pytest.approx(1.0) and counts["unconstrained"] == 1.0
    assert sums["non-exclusive"] == pytest.approx(8.0) and counts["non-exclusive"] == 4.0
    assert sums["constrained"] == pytest.approx(7.0) and counts["constrained"] == 1.0


def test_amn_empty_local_cluster_uploads_a_centroid_inside_the_box():
    """With centroid_post=none centroids can leave [-1, 1]; the stand-in an empty local cluster
    uploads is clipped, so the 2B/M sensitivity still bounds it."""
    settings = dataclasses.replace(
        Settings.of(HflKmeansConfig()),
        aggregation="amn",
        assignment="unconstrained",
        centroid_post="none",
    )
    cfg = HflKmeansConfig(aggregation="amn", assignment="unconstrained", noise="none", k=2)
    table = pa.table({"x0": [0.1, 0.2, 0.3]})
    ctx = StepContext(
        name="p0",
        role="party",
        seed=0,
        table=table,
        meta={"columns": ["x0"], "lo": [-1.0], "hi": [1.0]},
    )
    params = derive_setup(cfg, 6, 1)
    ctx.state.update(group_key=bytes(32))
    prepare_step(ctx, params, settings=settings, order=["p0", "p1"])
    ctx.state["centers"] = np.array([[0.2], [25.0]])  # cluster 1 far outside, and empty
    message = iterate_step(ctx, t=1)
    words = pads.from_ring(
        message.payload
        - pads.party_pad(
            pads.subkey(bytes(32), pads.INFO_PADS), 1, 0, params.length, params.ring_bits
        ),
        params.ring_bits,
    )
    uploaded = words / params.scale
    assert uploaded[1] == pytest.approx(1.0 / 2, abs=2**-15)  # clip(25) / M
    assert uploaded[0] == pytest.approx(0.2 / 2, abs=2**-15)


def test_values_outside_the_declared_bounds(tmp_path):
    path = tmp_path / "v.csv"
    path.write_text("v\n" + "\n".join(str(v) for v in [0.5, 1.0, 2.0, 3.0, 9.0, 1.5]) + "\n")
    options = dict(data={"path": str(path)}, bounds={"v": [0, 4]}, k=2, noise="none")
    with pytest.raises(DataError) as err:
        run(**options)
    assert err.value.field == "bounds.v" and "1 of 6 values of column 'v'" in str(err.value)
    assert "out_of_bounds=clip" in str(err.value)
    clipped = run(out_of_bounds="clip", **options)
    assert clipped.metrics["clipped"]["v"]["count"] == 1
    assert "1 of 6 bounds.v values clipped to [0, 4]" in clipped.headline
    # the clipped value sits at the bound: the centroids are those of 0.5, 1, 1.5, 2, 3, 4
    inside = dict(options, data={"path": str(tmp_path / "w.csv")})
    (tmp_path / "w.csv").write_text("v\n" + "\n".join(["0.5", "1.0", "2.0", "3.0", "4.0", "1.5"]))
    reference = run(**inside)
    assert clipped.tables["centroids"].equals(reference.tables["centroids"])
    assert reference.metrics["clipped"]["v"]["count"] == 0
    assert "clipped" not in reference.headline
