"""End to end: rayfed.run and the CLI on both backends; determinism; the run directory."""

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed.cli import main
from rayfed.errors import RoundTimeout
from rayfed.ldp.patterns import exact_loss

SMALL = dict(users=3000, seed=11)


def run_local(out_dir=None, **kw):
    return rayfed.run(
        "pattern-count",
        backend="local",
        out_dir=str(out_dir) if out_dir else None,
        **{**SMALL, **kw},
    )


def test_same_seed_same_result_and_different_seed_differs():
    a, b = run_local(), run_local()
    assert a.tables["counts"].equals(b.tables["counts"])
    c = run_local(seed=12)
    assert not np.array_equal(
        a.tables["counts"]["raw"].to_numpy(), c.tables["counts"]["raw"].to_numpy()
    )


@pytest.mark.ray
def test_ray_path_equals_in_process_path(ray_cluster):
    local = run_local(sample_rate=0.5, parties=3)
    on_ray = rayfed.run("pattern-count", out_dir=None, sample_rate=0.5, parties=3, **SMALL)
    assert on_ray.tables["counts"].equals(local.tables["counts"])
    assert on_ray.privacy.to_dict() == local.privacy.to_dict()
    assert on_ray.transcript.equals(local.transcript)


@pytest.mark.ray
def test_run_directory_is_complete_and_consistent(ray_cluster, out_dir):
    result = rayfed.run("pattern-count", out_dir=str(out_dir), epsilon=2.0, **SMALL)
    manifest = json.loads((out_dir / result.run_id / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["seed"] == 11 and manifest["config"]["protocol"]["epsilon"] == 2.0
    assert manifest["versions"]["ray"] and manifest["versions"]["dp-accounting"]
    # the ledger's total is what the result and the manifest report: the exact loss of ε/16 RR
    assert result.privacy.epsilon == pytest.approx(exact_loss(2.0 / 16))
    assert manifest["privacy"]["epsilon"] == result.privacy.epsilon
    assert manifest["privacy"]["per_scope"] == pytest.approx(
        {"p0": exact_loss(1 / 8), "p1": exact_loss(1 / 8)}
    )
    assert [e["scope"] for e in manifest["privacy"]["entries"]] == ["p0", "p1"]
    counts = pq.read_table(out_dir / result.run_id / manifest["tables"]["counts"])
    assert counts.equals(result.tables["counts"])
    assert counts.num_rows == 9 and set(counts.column_names) >= {
        "p0",
        "p1",
        "estimate",
        "raw",
        "true_count",
    }
    # communication: m(M+1) bits per party, packed into bytes (§5 check 7)
    transcript = pq.read_table(out_dir / result.run_id / "transcript.parquet").to_pylist()
    rr = [r for r in transcript if r["name"] == "rr_bits"]
    assert [r["sender"] for r in rr] == ["p0", "p1"] and all(r["dp_event"] for r in rr)
    assert all(3 * math.ceil(3000 / 8) <= r["bytes"] < 3 * math.ceil(3000 / 8) + 64 for r in rr)
    assert result.metrics["bits_per_party"] == {"p0": 9000, "p1": 9000}
    assert manifest["timings"] and manifest["transcript"]["bytes"] == sum(
        r["bytes"] for r in transcript
    )


@pytest.mark.ray
def test_failed_run_is_marked_failed(ray_cluster, out_dir, monkeypatch):
    import rayfed.federation as federation

    monkeypatch.setattr(federation, "STARTUP_DEADLINE_S", 1e-3)
    with pytest.raises(RoundTimeout):
        rayfed.run("pattern-count", out_dir=str(out_dir), deadline_s=1e-3, **SMALL)
    (run_dir,) = out_dir.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "RoundTimeout" in manifest["error"]
    assert not list(run_dir.glob("*.parquet"))


def test_estimates_track_truth_within_predicted_sd():
    result = run_local(users=20_000, epsilon=4.0)
    t = result.tables["counts"].to_pydict()
    z = (np.array(t["raw"]) - np.array(t["true_count"])) / np.array(t["predicted_sd"])
    assert np.all(np.abs(z) < 4.5)  # 9 patterns
    # the estimate is the raw unbiased count clipped at 0 (README), cell by cell
    assert np.array_equal(np.array(t["estimate"]), np.maximum(np.array(t["raw"]), 0.0))


def test_exact_calibration_spends_epsilon_and_has_less_noise():
    paper = run_local(users=20_000, epsilon=1.0)
    exact = run_local(users=20_000, epsilon=1.0, calibration="exact")
    assert exact.privacy.epsilon == pytest.approx(1.0)
    assert paper.privacy.epsilon == pytest.approx(0.5026, abs=1e-4)
    # v = 2: Var = m c² + c (n1 + n2) with 0 <= n1 + n2 <= 2m, so per pattern the sd ratio lies in
    # [c_p / sqrt(c_e² + 2 c_e), sqrt(c_p² + 2 c_p) / c_e]; c = 1/(16 ε'²) - 1/4
    c_p = 1 / (16 * (1 / 16) ** 2) - 0.25
    c_e = 1 / (16 * (math.tanh(0.25) / 2) ** 2) - 0.25
    ratio = np.array(paper.tables["counts"]["predicted_sd"]) / np.array(
        exact.tables["counts"]["predicted_sd"]
    )
    assert np.all(
        (ratio >= c_p / math.sqrt(c_e**2 + 2 * c_e)) & (ratio <= math.sqrt(c_p**2 + 2 * c_p) / c_e)
    )
    assert 3.5 < ratio.mean() < 4.2  # ≈ c_p / c_e = 3.85


def test_csv_input_with_labels_and_requested_patterns(tmp_path):
    gen = np.random.default_rng(0)
    n = 4000
    city = gen.choice(["oslo", "rome", "lima"], n)
    age = gen.integers(0, 4, n)
    sick = gen.integers(0, 2, n)
    path = tmp_path / "people.csv"
    pacsv.write_csv(pa.table({"id": np.arange(n), "city": city, "age": age, "sick": sick}), path)
    result = rayfed.run(
        "pattern-count",
        backend="local",
        out_dir=None,
        epsilon=4.0,
        data={
            "path": str(path),
            "key": "id",
            "columns": {"hospital": ["sick"], "registry": ["city", "age"]},
        },
        domains={"city": ["oslo", "rome", "lima"], "age": 4, "sick": 2},
        evaluate=True,
        patterns=[[1, "rome|2"], [0, "oslo|0"]],
    )
    t = result.tables["counts"].to_pydict()
    assert t["hospital"] == ["1", "0"] and t["registry"] == ["rome|2", "oslo|0"]
    truth = [
        np.sum((sick == 1) & (city == "rome") & (age == 2)),
        np.sum((sick == 0) & (city == "oslo") & (age == 0)),
    ]
    assert t["true_count"] == [float(x) for x in truth]
    z = (np.array(t["raw"]) - truth) / np.array(t["predicted_sd"])
    assert np.all(np.abs(z) < 4)


def test_cli_list_help_run_and_errors(out_dir, capsys):
    assert main(["list"]) == 0
    assert "pattern-count" in capsys.readouterr().out
    assert main(["run", "pattern-count", "--help"]) == 0
    text = capsys.readouterr().out
    assert "sample_rate" in text and "deadline_s" in text and "default 1.0" in text
    assert (
        main(
            [
                "run",
                "pattern-count",
                "--backend",
                "local",
                "--out",
                str(out_dir),
                "--quiet",
                "--set",
                "users=500",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "epsilon=0.5026" in out and "bytes" in out and str(out_dir) in out
    assert main(["run", "nope"]) == 2
    assert "unknown protocol" in capsys.readouterr().err
    assert main(["run", "pattern-count", "--set", "epsilon=-1", "--backend", "local"]) == 2
    assert "epsilon" in capsys.readouterr().err


def test_yaml_config_and_set_precedence(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("epsilon: 2.0\nusers: 800\nbackend: local\nout_dir: null\ndata:\n  key: null\n")
    result = rayfed.run("pattern-count", str(cfg), sets=["users=900"])
    assert result.metrics["users"] == 900
    assert result.config["protocol"]["epsilon"] == 2.0


def test_out_of_domain_zero_mode_counts_nowhere_and_is_noted(tmp_path):
    path = str(tmp_path / "d.csv")
    pacsv.write_csv(pa.table({"a": [0, 1, 5], "b": ["x", "y", "x"]}), path)
    result = rayfed.run(
        "pattern-count",
        backend="local",
        out_dir=None,
        data={"path": path},
        domains={"a": 2, "b": ["x", "y"]},
        out_of_domain="zero",
        evaluate=True,
    )
    assert any("all-zero" in note and "'a': 1" in note for note in result.privacy.notes)
    assert (
        sum(result.tables["counts"]["true_count"].to_pylist()) == 2
    )  # the third user counts nowhere


def test_float_column_with_a_list_domain_matches_typed_values(tmp_path):
    path = str(tmp_path / "f.csv")
    pacsv.write_csv(pa.table({"a": [1.0, 2.0, 2.0], "b": [0, 1, 1]}), path)
    result = rayfed.run(
        "pattern-count",
        backend="local",
        out_dir=None,
        data={"path": path},
        domains={"a": [1, 2], "b": 2},
        evaluate=True,
    )
    counts = {(r["p0"], r["p1"]): r["true_count"] for r in result.tables["counts"].to_pylist()}
    assert counts[("1", "0")] == 1 and counts[("2", "1")] == 2


def test_numbers_in_exponent_notation_are_accepted():
    result = rayfed.run(
        "pattern-count", backend="local", out_dir=None, sets=["epsilon=5e-1", "users=1e3"]
    )
    assert result.config["protocol"]["epsilon"] == 0.5 and result.metrics["users"] == 1000


@pytest.mark.parametrize("calibration", ["paper", "exact"])
@pytest.mark.parametrize("epsilon", [0.3, 0.7, 1.3])
def test_any_epsilon_runs_and_spends_the_exact_loss(epsilon, calibration):
    """Regression: charged and drawn events must match for ε whose ε/16 is not exact in binary."""
    result = run_local(users=500, epsilon=epsilon, calibration=calibration)
    # Alg. 1's ε' = ε/16, or the exact calibration's tanh(ε/4)/2 (written out, not imported)
    eps_prime = epsilon / 16 if calibration == "paper" else math.tanh(epsilon / 4) / 2
    assert result.privacy.epsilon == pytest.approx(exact_loss(eps_prime), rel=1e-12)
    assert result.privacy.epsilon <= epsilon * (1 + 1e-12)


def test_failure_mid_run_marks_the_run_failed(out_dir, monkeypatch):
    from rayfed.protocols.pattern_count import driver

    def broken(ctx, *args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(driver, "estimate_step", broken)
    with pytest.raises(rayfed.PartyFailed, match="coordinator.*disk on fire"):
        run_local(out_dir=out_dir)
    (run_dir,) = out_dir.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "disk on fire" in manifest["error"]
    assert (
        manifest["transcript"]["messages"] == 2
    )  # the parties' messages were sent before the failure


@pytest.mark.parametrize(
    "change,what",
    [
        ({"accountant": "rpd"}, "accountant"),
        ({"composition": "both"}, "composition"),
        ({"relation": None}, "relation"),
        ({"statement": " "}, "statement"),
    ],
)
def test_a_bad_privacy_declaration_is_refused_before_any_run_directory(
    change, what, out_dir, monkeypatch
):
    """A protocol whose plan declares an unknown accountant (the audit's "rpd"), an unknown
    composition, no relation or no statement is refused by the core — a DeclarationError naming
    the protocol and the field, not a ConfigError about an option no user can set — and nothing
    is written."""
    import dataclasses

    from rayfed.errors import DeclarationError

    honest = type(rayfed.protocols.get_protocol("pattern-count")).plan

    def plan(cfg, seed):
        made = honest(cfg, seed)
        return dataclasses.replace(made, privacy=dataclasses.replace(made.privacy, **change))

    monkeypatch.setattr(
        type(rayfed.protocols.get_protocol("pattern-count")), "plan", staticmethod(plan)
    )
    with pytest.raises(DeclarationError, match=f"pattern-count: its privacy declaration's {what}"):
        rayfed.run("pattern-count", backend="local", out_dir=str(out_dir), users=100)
    assert not any(out_dir.iterdir())


def test_a_release_the_accountant_cannot_account_is_refused_before_any_run(out_dir, monkeypatch):
    """The dry run: a declared Gaussian release under the pure accountant (which does not
    support it: dp-accounting's supports()) and a release of another relation are refused."""
    import dataclasses

    from rayfed.errors import DeclarationError
    from rayfed.privacy import Gaussian, Interval, Measurement, Neighbours

    honest = type(rayfed.protocols.get_protocol("pattern-count")).plan
    relation = Neighbours("replace_one", "user's value", at_one_party=True)  # the protocol's
    gaussian = Measurement("a Gaussian", Gaussian(1.0), Interval(0, 1), relation)
    other = Measurement(
        "add/remove", Gaussian(1.0), Interval(0, 1), Neighbours("add_or_remove_one", "value")
    )
    for extra, message in ((gaussian, "cannot account"), (other, "one value added or removed")):

        def plan(cfg, seed, extra=extra):
            made = honest(cfg, seed)
            privacy = dataclasses.replace(
                made.privacy, measurements=made.privacy.measurements + (extra,)
            )
            return dataclasses.replace(made, privacy=privacy)

        monkeypatch.setattr(
            type(rayfed.protocols.get_protocol("pattern-count")), "plan", staticmethod(plan)
        )
        with pytest.raises(DeclarationError, match=message):
            rayfed.run("pattern-count", backend="local", out_dir=str(out_dir), users=100)
        assert not any(out_dir.iterdir())


def test_an_embedded_ray_never_joins_a_cluster_started_on_the_machine():
    """With no address, ``ray.init()`` joins the last ``ray start`` cluster of this machine (and
    refuses num_cpus there); an embedded run must start its own. A subprocess where Ray believes
    such a cluster exists (at an address nobody listens on) starts its embedded Ray all the same."""
    import os
    import subprocess
    import sys

    code = (
        "import ray._private.services as s\n"
        "s.find_bootstrap_address = lambda temp_dir: '127.0.0.1:1'\n"
        "import rayfed\n"
        "print(int(rayfed.ensure_ray(num_cpus=1)['CPU']))\n"
        "rayfed.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"
