"""vfl-kmeans end to end: the paper's anchors and orderings (spec shared/specs/vfl-kmeans.md §6
R1–R5, R9), the ledger, the transcript, data files, and Ray == in-process.

Every run uses the synthetic mixed Gaussian of §5.1 (n = 20,000, m = 8, k = 5, σ = 0.1); a seed
fixes both the data and the noise. The private losses vary a lot from seed to seed (DPLSF's
noisy tree), so each comparison averages several seeds and states the standard error it relies on.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed.clustering import fm
from rayfed.clustering.fm_privacy import calibrate
from rayfed.config import DataConfig
from rayfed.protocols.vfl_kmeans.config import VflKmeansConfig
from rayfed.protocols.vfl_kmeans.params import server_params

#: the module (the package's ``plan`` attribute is the function)
vfl_plan = importlib.import_module("rayfed.protocols.vfl_kmeans.plan")

PAPER_S2 = {  # Table 2 of the paper: normalised loss, synthetic, S = 2
    1.0: {"dpfmps-2pest": 0.7193, "ind-lap": 1.1724, "ldp-agg-2pest": 1.2716},
    4.0: {"dpfmps-2pest": 0.1525, "ind-lap": 0.9640, "ldp-agg-2pest": 0.3069},
}
PAPER_CENTRAL_DPLSF_EPS4 = 0.1240
#: the paper's noise in the sketches (Lemma 1's ε′): R2–R4 reproduce its numbers, which were
#: obtained with it — at the joint ε it really costs (the ledger says; issue 25)
PAPER_NOISE = {"sketch_calibration": "lemma1"}


def run(method="dpfmps-2pest", **options):
    return rayfed.run("vfl-kmeans", method=method, backend="local", out_dir=None, **options)


def losses(method, seeds, **options) -> np.ndarray:
    return np.array([run(method, seed=s, **options).metrics["loss"] for s in seeds])


def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(values.size))


def test_nonprivate_anchors():
    """R1: central k-means ≈ 0.0763 (the spread of clipped Gaussians over seeds is 0.073–0.078,
    spec §5.1) and non-private VFL within 0.0015 of it (failure signal: > 0.01 above)."""
    for parties in (2, 4):
        for seed in range(2):
            central = run("central-kmeans", seed=seed, parties=parties)
            vfl = run("vfl-nonprivate", seed=seed, parties=parties)
            assert abs(central.metrics["loss"] - 0.0763) < 0.004
            assert abs(vfl.metrics["loss"] - central.metrics["loss"]) < 0.0015
            assert vfl.metrics["v_measure"] > 0.97 and central.metrics["v_measure"] > 0.99
            assert vfl.privacy.summary().startswith("no differential privacy")


@pytest.mark.slow
def test_s2_eps1_ordering_and_magnitude():
    """R2 at S = 2, ε = 1: DPFMPS-2PEst < IND-LAP < LDP-AGG-2PEst, and DPFMPS within ±50 % of the
    paper's 0.72 with the spec's line-13 rule (clip and rescale), with the paper's sketch noise.
    With the default simplex projection DPFMPS is lower still (≈ 0.35; README); with the joint
    calibration (the default) it stays far below IND-LAP (≈ 0.39 against 1.02)."""
    dpfmps = losses("dpfmps-2pest", range(8), **PAPER_NOISE)
    dpfmps_clip = losses("dpfmps-2pest", range(8), projection="clip", **PAPER_NOISE)
    joint = losses("dpfmps-2pest", range(8))  # 2.9x the phantoms: still far below IND-LAP
    ind = losses("ind-lap", range(16))
    ldp = losses("ldp-agg-2pest", range(16))
    # paired over the first 16 seeds (same data): the LDP-IND gap is several of its standard errors
    gap, gap_se = mean_and_se(ldp - ind)
    assert gap > 3 * gap_se
    assert dpfmps.mean() < ind.mean() and dpfmps_clip.mean() < ind.mean()
    mean, se = mean_and_se(dpfmps_clip)
    assert 0.5 * 0.72 < mean < 1.5 * 0.72, (mean, se)
    assert dpfmps.mean() + 3 * mean_and_se(dpfmps)[1] < ind.mean()
    assert joint.mean() + 3 * mean_and_se(joint)[1] < ind.mean()


@pytest.mark.slow
def test_s2_eps4_close_to_central_dplsf():
    """R3 at S = 2, ε = 4 (the paper's sketch noise): DPFMPS-2PEst <= 1.3 x central DPLSF. Our
    central DPLSF (≈ 0.079) is better than the paper's (0.124), so the bound is checked against
    ours — the stricter one."""
    seeds = range(12)
    dpfmps = losses("dpfmps-2pest", seeds, epsilon=4, **PAPER_NOISE)
    central = losses("central-dplsf", seeds, epsilon=4)
    ind = losses("ind-lap", seeds, epsilon=4)
    ratio = dpfmps.mean() / central.mean()
    ratio_se = ratio * mean_and_se(dpfmps)[1] / dpfmps.mean()  # central's se is 10x smaller
    assert ratio + ratio_se < 1.3, (ratio, ratio_se)
    assert dpfmps.mean() < 1.3 * PAPER_CENTRAL_DPLSF_EPS4
    assert dpfmps.mean() < ind.mean()


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_s4_2pest_beats_basicest_and_baselines(epsilon):
    """R4 at S = 4, with the paper's sketch noise: 2PEst clearly better than BasicEst (same
    sketches: paired by seed), and the paper's orderings (ε=1: 2PEst < IND < LDP; ε=4:
    2PEst < LDP < IND)."""
    seeds = range(4)
    two_pass = losses("dpfmps-2pest", seeds, epsilon=epsilon, parties=4, **PAPER_NOISE)
    basic = losses("dpfmps-basic", seeds, epsilon=epsilon, parties=4, **PAPER_NOISE)
    ind = losses("ind-lap", seeds, epsilon=epsilon, parties=4)
    ldp = losses("ldp-agg-2pest", seeds, epsilon=epsilon, parties=4)
    gap, gap_se = mean_and_se(basic - two_pass)
    assert gap > 2 * gap_se, (basic, two_pass)  # paired by seed: the same sketches
    if epsilon == 1.0:
        assert two_pass.mean() < ind.mean() < ldp.mean()
        # charged what they cost jointly, four parties' sketches need ~10^6 phantoms for 20,000
        # users (a four-way tie of the user's hash is telling): 2PEst falls below IND-LAP
        joint = losses("dpfmps-2pest", seeds, epsilon=epsilon, parties=4)
        assert joint.mean() > ind.mean()
    else:
        assert two_pass.mean() < ldp.mean() < ind.mean()


def test_basic_and_2pest_give_the_same_weights_at_s2():
    """R5: at S = 2, 2PEst is BasicEst (the same sketches give identical grid weights)."""
    a = run("dpfmps-2pest", seed=3, users=4000, sketches=512).tables["grid"]
    b = run("dpfmps-basic", seed=3, users=4000, sketches=512).tables["grid"]
    assert a.column("weight").equals(b.column("weight"))


@pytest.mark.parametrize("sketches,k_prime", [(4096, 5), (2048, 8)])
def test_sketch_payload_in_transcript(sketches, k_prime):
    """R9: each party's sketch message is exactly 8·M·k' bytes; its centers 8·k'·m_ℓ bytes; the
    per-user baseline sends 8n bytes."""
    result = run(sketches=sketches, k_prime=k_prime, users=5000)
    rows = result.transcript.to_pylist()
    sketches_sent = [r for r in rows if r["name"] == "fm_sketches"]
    assert {r["sender"] for r in sketches_sent} == {"p0", "p1"}
    assert all(r["bytes"] == 8 * sketches * k_prime for r in sketches_sent)
    assert all(r["receiver"] == "coordinator" for r in sketches_sent)
    centers = [r for r in rows if r["name"] == "local_centers"]
    assert sorted(r["bytes"] for r in centers) == [8 * k_prime * 4] * 2
    # nothing about the hash key reaches the coordinator
    assert all(r["receiver"] != "coordinator" for r in rows if r["name"].startswith("key_"))
    labels = run("vfl-nonprivate", users=5000).transcript.to_pylist()
    assert [r["bytes"] for r in labels if r["name"] == "labels"] == [8 * 5000] * 2


def test_ledger_totals_equal_the_declared_budget():
    """Every noise addition is charged and the totals equal Theorem 4's split — with the parties'
    sketches charged once, jointly, at their share (bε/2, δ) (they share the hash keys)."""
    result = run(epsilon=2.0, users=4000, sketches=512)
    p = result.privacy
    assert p.epsilon <= 2.0 and p.epsilon == pytest.approx(2.0, abs=0.01)
    assert p.delta == pytest.approx(1 / 4000)
    assert (p.budget_epsilon, p.budget_delta) == (2.0, pytest.approx(1 / 4000))
    labels = sorted(e["label"] for e in p.entries)
    assert labels == sorted(
        ["noisy user count n̂"] + ["DPLSF local clustering"] * 2 + ["FM membership sketches"]
    )
    (sketch,) = [e for e in p.entries if e["label"] == "FM membership sketches"]
    assert sketch["scope"] == "run" and sketch["delta"] == pytest.approx(1 / 4000)
    assert sketch["epsilon"] <= 0.98 * 2.0 / 2 and sketch["epsilon"] > 0.97 * 0.98
    m = result.metrics
    assert (m["sketch_epsilon"], m["sketch_delta"]) == (sketch["epsilon"], sketch["delta"])
    calibration = calibrate(0.98, 1 / 4000, 512, 2, 1.0)
    assert m["sketch_phantoms"] == calibration.phantoms and m["sketch_floor"] == calibration.floor
    # both parties' sketch messages carry that one charge
    carried = [r for r in result.transcript.to_pylist() if r["name"] == "fm_sketches"]
    assert len(carried) == 2
    assert all(json.loads(r["dp_event"])["epsilon"] == sketch["epsilon"] for r in carried)
    assert p.neighboring_relation.lower().startswith("add")
    assert any("charged as one release" in note for note in p.notes)
    assert "jointly" in p.statement and "alone in its cluster" in p.statement
    assert "δ = 0.00025 is public (1/users, the synthetic data's declared size)" in p.statement
    assert "none is read from the data, and n reaches the server only as n̂" in p.statement
    ind = run("ind-lap", epsilon=2.0, users=4000).privacy
    assert (ind.epsilon, ind.delta) == (pytest.approx(2.0), 0.0)
    ldp = run("ldp-agg-2pest", epsilon=2.0, users=4000).privacy
    assert ldp.epsilon == pytest.approx(2.0) and ldp.neighboring_relation.lower().startswith("rep")
    # replace-one: each party's DPLSF has the sensitivities of a replaced point (2 and 2d) at ε1
    dplsf_entries = [e for e in ldp.entries if e["label"] == "DPLSF local clustering"]
    assert len(dplsf_entries) == 2
    for e in dplsf_entries:
        levels, sums = e["events"]
        assert levels["count"] == 21 and levels["event"]["sensitivity"] == 2
        eps1 = 21 * levels["event"]["noise_parameter"] * 2 + 1 / sums["noise_multiplier"]
        assert eps1 == pytest.approx(2.0 / 4)
    central = run("central-dplsf", epsilon=2.0, users=4000).privacy
    assert central.epsilon == pytest.approx(2.0)


def test_paper_calibration_spends_more_than_it_charges_per_party():
    """sketch_calibration=lemma1: the paper's noise (Lemma 1's ε′, the tables bit for bit), and
    the ledger charges what it costs jointly — above the ε requested, as the headline says."""
    joint = run(users=2000, sketches=256, seed=4)
    paper = run(users=2000, sketches=256, seed=4, sketch_calibration="lemma1")
    lemma1 = fm.sketch_epsilon(0.245, 1 / 4000, 256)
    assert paper.metrics["sketch_eps_prime"] == lemma1
    assert paper.metrics["sketch_phantoms"] == fm.phantom_count(lemma1) == 752
    assert joint.metrics["sketch_phantoms"] == 782
    # the joint loss of 752 phantoms at δ = 1/n: ≈ 0.521 (dp-accounting's bracket 0.514–0.539,
    # tests/test_vfl_kmeans_privacy.py), not the 2 x 0.245 the paper charges
    assert paper.metrics["sketch_epsilon"] == pytest.approx(0.5207, abs=0.001)
    spent = paper.privacy.epsilon
    assert spent == pytest.approx(0.02 + 0.49 + 0.5207, abs=0.001) and spent > 1.0
    assert paper.privacy.requested_epsilon == 1.0
    assert "ε spent" in paper.headline and "ε requested 1" in paper.headline
    assert joint.privacy.epsilon <= 1.0 and "ε spent" not in joint.headline


def test_out_of_bounds_values_are_clipped_and_counted_or_refused(tmp_path):
    """A data file's values outside their declared bounds: refused naming the column (error, or
    refuse), or clipped to the bounds and stated in the headline, the notes and the metrics."""
    gen = np.random.default_rng(2)
    n = 400
    a, b = gen.uniform(0, 10, n), gen.uniform(-1, 1, n)
    a[:7] = [-3, 11, 12, 40, -0.5, 10.5, 99]  # 7 values outside [0, 10]
    path = tmp_path / "users.csv"
    pacsv.write_csv(pa.table({"id": np.arange(n), "a": a, "b": b}), path)
    options = dict(
        method="ind-lap",
        k=2,
        k_prime=2,
        bounds={"a": [0, 10], "b": [-1, 1]},
        data={"path": str(path), "key": "id"},
    )
    for policy in ("error", "refuse"):
        with pytest.raises(rayfed.DataError, match="bounds.a") as info:
            run(out_of_bounds=policy, **options)
        assert "7 of 400 values" in info.value.problem
    clipped = run(out_of_bounds="clip", **options)
    assert "7 of 400 a values clipped to [0, 10]" in clipped.headline
    assert any("7 of 400 a values clipped" in note for note in clipped.privacy.notes)
    assert clipped.metrics["clipped"] == {"a": 7}
    inside = run(out_of_bounds="clip", **(options | {"method": "central-kmeans"}))
    assert "clipped" in inside.headline  # the baselines see the same clipped data


def _with_one_more_user(monkeypatch):
    """The synthetic generator's table with one user added (id n, at the corner (1, …, 1)): the
    add/remove neighbour of the table the same options make."""
    make = vfl_plan.synthetic_table

    def plus_one(users, dims, k, spread, seed):
        table = make(users, dims, k, spread, seed)
        user = {"user_id": [users], **{f"x{j}": [1.0] for j in range(dims)}, "label": [0]}
        return pa.concat_tables([table, pa.table(user, schema=table.schema)])

    monkeypatch.setattr(vfl_plan, "synthetic_table", plus_one)


def _sent_to_server(cfg: VflKmeansConfig):
    """What the plan fixes before any actor starts and the server is given or charged: its
    parameters (n_p among them), the declared releases' events and the budget."""
    p = vfl_plan.plan(cfg, 0)
    params = server_params(cfg, p.params.split, p.params.releases)
    return params, [m.event for m in p.privacy.measurements], p.privacy.budget, p.params.users


def test_neighbouring_datasets_give_the_server_the_same_parameters(monkeypatch):
    """n and n + 1 users (one user added, the same options) give the server the same n_p and
    every other parameter, and the same declared releases: δ is public (1/users, the synthetic
    data's declared size), not 1/n counted from the data — at n = 2002 δ = 1/n gave n_p = 782
    and its neighbour's 1/2003 gave 783. Both runs are charged the same events, within ε = 1."""
    cfg = VflKmeansConfig(users=2002, sketches=256)
    d = _sent_to_server(cfg)
    _with_one_more_user(monkeypatch)
    d_prime = _sent_to_server(cfg)
    assert (d[3], d_prime[3]) == (2002, 2003)  # the neighbour has one more user
    assert d[0] == d_prime[0] and d[0].phantoms == 782
    assert d[1:3] == d_prime[1:3]
    sketch = calibrate(0.49, 1 / 2002, 256, 2, 1.0)  # δ = 1/users, the declared size
    assert d_prime[0].phantoms == sketch.phantoms
    runs = [run(users=2002, sketches=256)]
    monkeypatch.undo()
    runs.append(run(users=2002, sketches=256))
    assert [r.metrics["users"] for r in runs] == [2003, 2002]
    assert runs[0].privacy.entries == runs[1].privacy.entries  # the same events charged
    for r in runs:
        assert r.privacy.epsilon <= 1.0 and r.privacy.delta == pytest.approx(1 / 2002)
        assert "δ = 0.0004995 is public" in r.privacy.statement


def test_a_data_file_needs_a_public_delta_for_the_sketches(tmp_path):
    """A data file has no declared size: the sketches' δ must be given (δ = 1/n from the file
    would tell the server n through n_p); a file of n and one of n + 1 users then give the server
    the same parameters (k' from the formula, which reads δ, included)."""
    gen = np.random.default_rng(3)
    n = 600
    x = gen.uniform(-1, 1, (n + 1, 2))
    paths = []
    for rows in (n, n + 1):
        path = tmp_path / f"users{rows}.csv"
        pacsv.write_csv(pa.table({"id": np.arange(rows), "a": x[:rows, 0], "b": x[:rows, 1]}), path)
        paths.append(str(path))
    options = dict(k=2, k_prime_rule="formula", sketches=256, bounds={"a": [-1, 1], "b": [-1, 1]})
    with pytest.raises(rayfed.ConfigError, match="delta"):
        run(data={"path": paths[0], "key": "id"}, **options)
    sent = [
        _sent_to_server(VflKmeansConfig(delta=1e-4, data=DataConfig(path=p, key="id"), **options))
        for p in paths
    ]
    assert (sent[0][3], sent[1][3]) == (n, n + 1)
    assert sent[0][:3] == sent[1][:3]
    assert sent[0][0].phantoms == calibrate(0.49, 1e-4, 256, 2, 1.0).phantoms
    result = run(delta=1e-4, data={"path": paths[1], "key": "id"}, **options)
    assert result.privacy.epsilon <= 1.0 and result.privacy.delta == pytest.approx(1e-4)


def test_literal_estimator_collapses_to_uniform_weights():
    """§2.8: with the paper's literal FM estimator every cell's estimate is negative, so the spec's
    clip-and-rescale gives uniform weights (intersection error ≈ 1.60, IND's level); the corrected
    estimator does far better on the same sketches."""
    options = dict(epsilon=4.0, k_prime=5, projection="clip")
    literal = [run(estimator="literal", seed=s, **options) for s in range(2)]
    corrected = [run(seed=s, **options) for s in range(2)]
    for r in literal:
        w = r.tables["grid"].column("weight").to_numpy()
        assert np.allclose(w, w.mean())
        assert r.metrics["intersection_error"] > 1.4
    assert np.mean([r.metrics["intersection_error"] for r in corrected]) < 0.8


def test_data_file_with_bounds_key_and_split(tmp_path):
    """A user's CSV: rows in any order (aligned by key), declared bounds, a non-contiguous split,
    a label column; centers come back in data units inside the bounds; OS key agreement."""
    gen = np.random.default_rng(5)
    n = 3000
    label = gen.integers(0, 3, n)
    means = np.array([[10, 200, 0.1, 5], [30, 800, 0.5, 1], [50, 500, 0.9, 3]], dtype=float)
    x = means[label] + gen.normal(0, [2, 30, 0.03, 0.3], (n, 4))
    x = np.clip(x, [0, 0, 0, 0], [60, 1000, 1, 6])
    order = gen.permutation(n)
    table = pa.table(
        {
            "id": order,
            "age": x[order, 0],
            "income": x[order, 1],
            "score": x[order, 2],
            "visits": x[order, 3],
            "segment": label[order],
        }
    )
    path = tmp_path / "users.csv"
    pacsv.write_csv(table, path)
    result = run(
        k=3,
        k_prime=3,
        epsilon=8.0,
        delta=1e-5,  # public: a data file has no declared size
        sketches=1024,
        key_agreement="secure",
        label="segment",
        bounds={"age": [0, 60], "income": [0, 1000], "score": [0, 1], "visits": [0, 6]},
        data={
            "path": str(path),
            "key": "id",
            "columns": {"a": ["age", "score"], "b": ["income", "visits"]},
        },
    )
    centers = result.tables["centers"]
    assert centers.column_names == ["cluster", "age", "income", "score", "visits"]
    for col, (lo, hi) in {"age": (0, 60), "income": (0, 1000)}.items():
        values = centers.column(col).to_numpy()
        assert (values >= lo).all() and (values <= hi).all()
    assert result.metrics["v_measure"] > 0.8
    assert result.privacy.randomness == "secure"  # key_agreement=secure makes the run secure
    assert result.config["run"]["randomness"] == "secure"  # and the manifest says so


@pytest.mark.ray
def test_ray_equals_local(ray_cluster):
    """The same seed gives the same centers, weights and ledger on Ray actors and in-process."""
    options = dict(method="dpfmps-2pest", parties=3, users=3000, sketches=256, seed=11)
    on_ray = rayfed.run("vfl-kmeans", out_dir=None, **options)
    local = rayfed.run("vfl-kmeans", backend="local", out_dir=None, **options)
    assert on_ray.tables["centers"].equals(local.tables["centers"])
    assert on_ray.tables["grid"].equals(local.tables["grid"])
    assert on_ray.privacy.epsilon == local.privacy.epsilon
    events = [json.loads(r["dp_event"]) for r in on_ray.transcript.to_pylist() if r["dp_event"]]
    assert len(events) == 1 + 3 + 3  # n̂, three DPLSF runs, three sketch matrices


def test_reproduction_job_small(run_small_job):
    """jobs/vfl_kmeans_repro.py --small: the table, ablation, Theorem 6 check, JSON and plot."""
    tmp_path = run_small_job("vfl_kmeans_repro.py", timeout=300)
    record = json.loads((tmp_path / "vfl_kmeans_repro.json").read_text())
    methods = {(r["method"], r["variant"]) for r in record["rows"]}
    assert {
        ("dpfmps-2pest", ""),
        ("ind-lap", ""),
        ("central-dplsf", ""),
        ("dpfmps-2pest", "clip"),
    } <= methods
    assert record["theorem6_R13"]["draws"] == 5 and "2" in record["ablation_R12"]
    # DPFMPS runs the paper's sketch noise, which spends more than requested (the parties share
    # the hash keys); variant "joint" and every other method stay within it
    paper = [
        r for r in record["rows"] if r["method"].startswith("dpfmps") and r["variant"] != "joint"
    ]
    within = [r for r in record["rows"] if r not in paper]
    assert paper and all(r["epsilon_spent"] > r["epsilon"] for r in paper)
    assert all(r["epsilon_spent"] <= (r["epsilon"] or 0) + 1e-9 for r in within)
    assert {r["epsilon"] for r in within if r["variant"] == "joint"} == {1.0, 4.0}
    assert record["theorem6_R13"]["phantoms"] == calibrate(0.49, 1 / 2000, 4096, 2, 1.0).phantoms
    assert (tmp_path / "vfl_kmeans_repro.png").stat().st_size > 20_000
