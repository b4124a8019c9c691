"""Bad input gets an error naming the field and what is allowed, before any actor starts and
without leaving a run directory behind."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed.errors import ConfigError, DataError
from rayfed.federation import Federation


@pytest.fixture(autouse=True)
def no_actor_may_start(monkeypatch):
    def refuse(self):
        raise AssertionError("an actor was started although the input was bad")

    monkeypatch.setattr(Federation, "start", refuse)


@pytest.fixture
def csv_file(tmp_path):
    def write(columns):
        path = tmp_path / "data.csv"
        pacsv.write_csv(pa.table(columns), path)
        return str(path)

    return write


def expect(error, match, out_dir, *args, **kwargs):
    with pytest.raises(error, match=match) as info:
        rayfed.run(*args, out_dir=str(out_dir), **kwargs)
    assert list(out_dir.iterdir()) == []  # nothing written, not even a failed run directory
    return info.value


def test_unknown_protocol(out_dir):
    err = expect(ConfigError, "protocol", out_dir, "no-such-protocol")
    assert "pattern-count" in err.allowed


def test_unknown_config_key(out_dir):
    err = expect(ConfigError, "epsilonn", out_dir, "pattern-count", epsilonn=1.0)
    assert err.field == "epsilonn" and "epsilon" in err.allowed
    err = expect(ConfigError, "data.pth", out_dir, "pattern-count", sets=["data.pth=x.csv"])
    assert "path" in err.allowed


def test_partition_naming_a_missing_column(out_dir, csv_file):
    path = csv_file({"a": [0, 1, 2], "b": [1, 0, 1]})
    err = expect(
        DataError,
        "data.columns.p1",
        out_dir,
        "pattern-count",
        data={"path": path, "columns": {"p0": ["a"], "p1": ["zz"]}},
        domains={"a": 3, "zz": 2},
    )
    assert "a" in err.allowed and "b" in err.allowed


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_in_data(out_dir, csv_file, bad):
    path = csv_file({"a": [0, 1, 2], "b": [1.0, bad, 0.0]})
    expect(
        DataError, "data.b", out_dir, "pattern-count", data={"path": path}, domains={"a": 3, "b": 2}
    )


def test_missing_values_in_data(out_dir, csv_file):
    path = csv_file({"a": [0, 1, 2], "b": pa.array([1, None, 0])})
    expect(
        DataError,
        "missing",
        out_dir,
        "pattern-count",
        data={"path": path},
        domains={"a": 3, "b": 2},
    )


@pytest.mark.parametrize("epsilon", [0, -0.5, float("inf")])
def test_epsilon_not_positive(out_dir, epsilon):
    err = expect(ConfigError, "epsilon", out_dir, "pattern-count", epsilon=epsilon)
    assert err.allowed


@pytest.mark.parametrize("delta", [1.0, -1e-9, 2])
def test_delta_outside_unit_interval(delta):
    with pytest.raises(ConfigError, match=r"delta.*\[0, 1\)"):
        rayfed.Budget(1.0, delta)


def test_more_parties_than_columns(out_dir, csv_file):
    path = csv_file({"a": [0, 1], "b": [1, 0]})
    err = expect(
        ConfigError,
        "parties",
        out_dir,
        "pattern-count",
        parties=3,
        data={"path": path},
        domains={"a": 2, "b": 2},
    )
    assert "at most 2" in err.allowed


@pytest.mark.parametrize("deadline", [0, -5])
def test_deadline_not_positive(out_dir, deadline):
    expect(ConfigError, "deadline_s", out_dir, "pattern-count", deadline_s=deadline)


def test_wrong_types_and_values_name_the_field(out_dir):
    expect(ConfigError, "users.*number", out_dir, "pattern-count", sets=["users=many"])
    expect(ConfigError, "calibration", out_dir, "pattern-count", calibration="tight")
    expect(ConfigError, "sample_rate", out_dir, "pattern-count", sample_rate=0)
    expect(ConfigError, "backend", out_dir, "pattern-count", backend="spark")
    expect(ConfigError, r"patterns\[0\]", out_dir, "pattern-count", patterns=[[0, 1, 2]])
    expect(ConfigError, r"patterns\[0\]\[1\]", out_dir, "pattern-count", patterns=[[0, 7]])
    expect(ConfigError, "max_patterns", out_dir, "pattern-count", domain_size=100, parties=4)


def test_file_columns_need_declared_domains(out_dir, csv_file):
    path = csv_file({"a": [0, 1], "b": [1, 0]})
    expect(ConfigError, "domains", out_dir, "pattern-count", data={"path": path})
    expect(
        ConfigError,
        "domains.b",
        out_dir,
        "pattern-count",
        data={"path": path, "columns": {"p0": ["a"], "p1": ["b"]}},
        domains={"a": 2},
    )


def test_missing_file_and_unknown_format(out_dir, tmp_path):
    expect(
        ConfigError,
        "data.path",
        out_dir,
        "pattern-count",
        data={"path": str(tmp_path / "nope.csv")},
    )
    odd = tmp_path / "data.xyz"
    odd.write_text("a\n1\n")
    expect(
        DataError,
        "data.format",
        out_dir,
        "pattern-count",
        data={"path": str(odd)},
        domains={"a": 2},
    )


def test_bad_yaml_config(out_dir, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- just\n- a list\n")
    expect(ConfigError, "--config", out_dir, "pattern-count", str(cfg))


def test_duplicate_user_keys(out_dir, csv_file):
    path = csv_file({"id": [1, 1], "a": [0, 1], "b": [1, 0]})
    expect(
        DataError,
        "data.key",
        out_dir,
        "pattern-count",
        data={"path": path, "key": "id"},
        domains={"a": 2, "b": 2},
    )


def test_values_outside_declared_domain_are_not_an_error_but_encode_as_zero():
    from rayfed.ldp.patterns import encode_values

    table = pa.table({"a": [0, 5, 1], "b": ["x", "y", "q"]})
    values = encode_values(table, ["a", "b"], {"a": 2, "b": ["x", "y"]})
    assert values.tolist() == [0, -1, -1]
    assert encode_values(table, ["a"], {"a": 2}).tolist() == [0, -1, 1]
    assert np.array_equal(encode_values(table, ["b"], {"b": ["x", "y", "q"]}), [0, 1, 2])


def test_unreachable_cluster_address_fails_instead_of_hanging(bounded):
    from rayfed.runtime import _check_reachable

    with pytest.raises(ConfigError, match="address.*nothing answers"):
        bounded(60, _check_reachable, "127.0.0.1:1", timeout_s=5)
    with pytest.raises(ConfigError, match="address"):
        bounded(60, _check_reachable, "ray://127.0.0.1:1", timeout_s=5)


@pytest.mark.parametrize("address", ["garbage", "host:port", "ray://nohost", "10.0.0.1:"])
def test_a_garbage_ray_address_is_a_named_error(address, monkeypatch, capsys):
    """From RAY_ADDRESS too: it was a ValueError traceback ("Invalid address format")."""
    import ray

    from rayfed.cli import main

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    monkeypatch.setenv("RAY_ADDRESS", address)
    code = main(["run", "secure-sum", "--quiet", "--set", "users=50", "--out", ""])
    err = capsys.readouterr().err
    assert code == 2
    assert (
        f"configuration error: address: {address!r} is not a Ray address (from RAY_ADDRESS)" in err
    )


def test_values_outside_the_declared_domain_are_an_error(out_dir, csv_file):
    path = csv_file({"a": [0, 1, 5], "b": ["x", "y", "x"]})
    err = expect(
        DataError,
        "domains.a",
        out_dir,
        "pattern-count",
        data={"path": path},
        domains={"a": 2, "b": ["x", "y"]},
    )
    assert "out_of_domain=zero" in err.allowed


def test_options_the_data_source_ignores_are_errors(out_dir, csv_file):
    expect(ConfigError, "domains", out_dir, "pattern-count", domains={"x0": 3})
    expect(ConfigError, "data.key", out_dir, "pattern-count", data={"key": "user_id"})
    path = csv_file({"a": [0, 1], "b": [1, 0]})
    expect(
        ConfigError,
        "users",
        out_dir,
        "pattern-count",
        users=50,
        data={"path": path},
        domains={"a": 2, "b": 2},
    )
    expect(
        ConfigError,
        "parties",
        out_dir,
        "pattern-count",
        parties=3,
        data={"path": path, "columns": {"p0": ["a"], "p1": ["b"]}},
        domains={"a": 2, "b": 2},
    )


def test_reserved_party_names(out_dir, csv_file):
    path = csv_file({"a": [0, 1], "b": [1, 0]})
    expect(
        ConfigError,
        "reserved",
        out_dir,
        "pattern-count",
        data={"path": path, "columns": {"coordinator": ["a"], "p1": ["b"]}},
        domains={"a": 2, "b": 2},
    )


def test_a_one_hot_encoding_too_large_for_memory(out_dir, csv_file):
    path = csv_file({"a": [0, 1], "b": [1, 0], "c": [0, 0]})
    err = expect(
        ConfigError,
        "data.columns.p0",
        out_dir,
        "pattern-count",
        patterns=[[0, 0]],
        data={"path": path, "columns": {"p0": ["a", "b"], "p1": ["c"]}},
        domains={"a": 2**20, "b": 2**12, "c": 2},
    )
    assert "GiB" in err.allowed


def test_paper_calibration_beyond_its_range(out_dir):
    expect(ConfigError, "epsilon", out_dir, "pattern-count", epsilon=7.8)


# --- vfl-kmeans ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["k", "k_prime", "sketches"])
@pytest.mark.parametrize("value", [0, -3])
def test_vfl_kmeans_nonpositive_sizes(out_dir, name, value):
    err = expect(ConfigError, name, out_dir, "vfl-kmeans", **{name: value})
    assert err.field == name


def test_vfl_kmeans_leaf_threshold_without_dplsf(out_dir):
    """vfl-nonprivate runs no DPLSF, so it refuses DPLSF's leaf_threshold (unknown values too)."""
    expect(
        ConfigError,
        "leaf_threshold",
        out_dir,
        "vfl-kmeans",
        method="vfl-nonprivate",
        leaf_threshold="radius",
    )
    expect(ConfigError, "leaf_threshold", out_dir, "vfl-kmeans", leaf_threshold="google")


def test_vfl_kmeans_party_without_columns(out_dir, csv_file):
    path = csv_file({"a": [0.1, 0.2], "b": [0.3, 0.4]})
    err = expect(
        ConfigError,
        "data.columns.p1",
        out_dir,
        "vfl-kmeans",
        data={"path": path, "columns": {"p0": ["a", "b"], "p1": []}},
        bounds={"a": [0, 1], "b": [0, 1]},
    )
    assert "column" in err.allowed


def test_vfl_kmeans_data_outside_declared_bounds(out_dir, csv_file):
    path = csv_file({"a": [0.1, 2.5, 0.3], "b": [0.3, 0.4, 0.5]})
    err = expect(
        DataError,
        "bounds.a",
        out_dir,
        "vfl-kmeans",
        delta=1e-5,  # a data file needs a public δ (the sketches)
        data={"path": path},
        bounds={"a": [0, 1], "b": [0, 1]},
    )
    assert "1 of 3 values" in err.problem and "out_of_bounds=clip" in err.allowed


def test_vfl_kmeans_missing_bounds(out_dir, csv_file):
    path = csv_file({"a": [0.1, 0.2], "b": [0.3, 0.4]})
    expect(ConfigError, "bounds", out_dir, "vfl-kmeans", data={"path": path}, delta=1e-5)
    err = expect(
        ConfigError,
        "bounds.b",
        out_dir,
        "vfl-kmeans",
        delta=1e-5,  # a data file needs a public δ (the sketches)
        data={"path": path, "columns": {"p0": ["a"], "p1": ["b"]}},
        bounds={"a": [0, 1]},
    )
    assert "[0, 100]" in err.allowed


def test_vfl_kmeans_grid_beyond_memory_limit(out_dir):
    err = expect(ConfigError, "k_prime", out_dir, "vfl-kmeans", k_prime=40, parties=4)
    assert "2,560,000 cells" in err.problem and "max_grid_cells=1,000,000" in err.problem


def test_vfl_kmeans_lemma1_condition(out_dir):
    """The paper's calibration of the sketches needs Lemma 1's ε2 <= 2 ln(1/δ2); the joint one
    does not (it is computed from the mechanism)."""
    err = expect(
        ConfigError,
        "epsilon",
        out_dir,
        "vfl-kmeans",
        epsilon=100.0,
        delta=0.4,
        sketch_calibration="lemma1",
    )
    assert "Lemma 1" in err.problem and "sketch_calibration=joint" in err.allowed
    expect(
        ConfigError,
        "sketch_calibration",
        out_dir,
        "vfl-kmeans",
        method="ind-lap",
        sketch_calibration="lemma1",
    )


def test_vfl_kmeans_file_errors_name_the_field(out_dir, csv_file):
    path = csv_file({"id": [1, 2, 3], "a": [0.1, 0.2, 0.3], "b": [0.3, 0.4, 0.5]})
    bounds = {"a": [0, 1], "b": [0, 1]}
    expect(
        DataError,
        "bounds.zz",
        out_dir,
        "vfl-kmeans",
        data={"path": path},
        bounds={"zz": [0, 1]},
        delta=1e-5,
    )
    err = expect(
        ConfigError,
        "data.columns.p0",
        out_dir,
        "vfl-kmeans",
        delta=1e-5,  # a data file needs a public δ (the sketches)
        data={"path": path, "key": "id", "columns": {"p0": ["id", "a"], "p1": ["b"]}},
        bounds=bounds | {"id": [0, 9]},
    )
    assert "key column" in err.problem
    expect(
        ConfigError,
        "parties",
        out_dir,
        "vfl-kmeans",
        delta=1e-5,  # a data file needs a public δ (the sketches)
        parties=3,
        data={"path": path, "columns": {"p0": ["a"], "p1": ["b"]}},
        bounds=bounds,
    )


@pytest.mark.parametrize(
    "options,field",
    [
        ({"parties": 1}, "parties"),
        ({"users": 1}, "users"),
        ({"method": "ind-lap", "delta": 1e-5}, "delta"),
        ({"method": "vfl-nonprivate", "k_prime": 3}, "k_prime"),
        ({"k_prime": 1}, "k_prime"),
    ],
)
def test_vfl_kmeans_inapplicable_options(out_dir, options, field):
    err = expect(ConfigError, field, out_dir, "vfl-kmeans", **options)
    assert err.field == field


@pytest.mark.parametrize(
    "protocol,options,field",
    [
        ("vfl-kmeans", {"iterations": 0}, "iterations"),
        ("vfl-kmeans", {"max_grid_cells": 0}, "max_grid_cells"),
        ("vfl-kmeans", {"count_fraction": 1.0}, "count_fraction"),
        ("vfl-kmeans", {"gamma": 0.0}, "gamma"),
        ("vfl-kmeans", {"cluster_sd": -0.1}, "cluster_sd"),
        ("vfl-kmeans", {"tolerance": -1.0}, "tolerance"),
        ("vfl-kmeans", {"method": "ind-lap", "delta": 1e-5}, "delta"),
        ("square-wave", {"tolerance": -1.0}, "tolerance"),
        ("square-wave", {"max_iterations": 0}, "max_iterations"),
        ("square-wave", {"range_queries": 0}, "range_queries"),
        ("square-wave", {"cohorts": 0}, "cohorts"),
        ("square-wave", {"method": "hh", "branching": 1}, "branching"),
        ("square-wave", {"method": "cfo", "buckets": 65536, "bins": 8192}, "bins"),
        ("vfl-primitives", {"alpha": 1.0}, "alpha"),
        ("vfl-primitives", {"sketch_constant": 0.0}, "sketch_constant"),
        ("vfl-primitives", {"nu": 0.0}, "nu"),
        ("vfl-primitives", {"radius": -1.0}, "radius"),
        ("vfl-primitives", {"dims": 0}, "dims"),
        ("vfl-primitives", {"users": 0}, "users"),
        ("vfl-primitives", {"task": "lowrank", "row_radius": 0.0}, "row_radius"),
        ("vfl-primitives", {"task": "l2-moment", "value_bounds": [1.0]}, "value_bounds"),
        ("vfl-primitives", {"task": "l2-moment", "neighbours": "paper", "nu": -1.0}, "nu"),
        ("vfl-primitives", {"task": "lowrank", "nu": 2.0}, "nu"),  # user-level: not read
        ("ldp-bitvector", {"restarts": 0}, "restarts"),
        ("ldp-bitvector", {"min_samples": 0}, "min_samples"),
        ("ldp-bitvector", {"rsp_dims": 0}, "rsp_dims"),
        ("ldp-bitvector", {"max_points": 0}, "max_points"),
        ("ldp-bitvector", {"consistence_radius": 0.0}, "consistence_radius"),
        ("ldp-bitvector", {"dbscan_eps": 0.0}, "dbscan_eps"),
        ("ldp-bitvector", {"adp_sigma": -1.0}, "adp_sigma"),
        ("ldp-bitvector", {"low": 10.0, "high": 5.0}, "high"),
        ("ldp-bitvector", {"bounds": [3.0, 1.0]}, "bounds"),
        ("ldp-bitvector", {"parties": 0}, "parties"),
        ("square-wave", {"data": {"key": "id"}}, "data.key"),
        ("hfl-kmeans", {"k": 0}, "k"),
        ("hfl-kmeans", {"iterations": 0}, "iterations"),
        ("hfl-kmeans", {"max_size": 0}, "max_size"),
        ("hfl-kmeans", {"min_size": -1}, "min_size"),
        ("hfl-kmeans", {"frac_bits": 31}, "frac_bits"),
        ("hfl-kmeans", {"rho": 0.0}, "rho"),
        ("hfl-kmeans", {"cluster_sd": 0.0}, "cluster_sd"),
        ("hfl-kmeans", {"dims": 0}, "dims"),
        ("hfl-kmeans", {"silhouette_points": 0}, "silhouette_points"),
        ("hfl-kmeans", {"epsilon": 0.0}, "epsilon"),
        ("hfl-kmeans", {"key_agreement": "os"}, "key_agreement"),
        ("hfl-kmeans", {"bounds": {"x0": [0, 1]}}, "bounds"),  # file option without data.path
        ("secure-sum", {"cohort_memory_mb": 0}, "cohort_memory_mb"),
        ("hfl-kmeans", {"party_resource": "slot", "backend": "ray"}, "party_resource"),
        ("secure-sum", {"fail": ["cohort=c0"]}, "fail"),
    ],
)
def test_new_protocols_name_the_field_at_fault(out_dir, protocol, options, field):
    err = expect(ConfigError, field, out_dir, protocol, **options)
    assert err.field == field


@pytest.mark.parametrize("protocol", ["secure-sum", "square-wave"])
def test_a_trillion_users_is_refused_before_any_data_is_built(protocol, out_dir):
    """Regression (issue 15): 10^12 users ended in a numpy MemoryError traceback."""
    expect(ConfigError, "users=1,000,000,000,000.*GiB", out_dir, protocol, users=10**12)


@pytest.mark.parametrize("content", ["", "a,b\n"])
def test_an_empty_or_header_only_file_has_no_rows(content, tmp_path, out_dir):
    path = tmp_path / "empty.csv"
    path.write_text(content)
    with pytest.raises(DataError, match="no rows") as err:
        rayfed.run("pattern-count", out_dir=str(out_dir), data={"path": str(path), "key": "a"})
    assert err.value.field == "data.path"


def test_vfl_kmeans_refuses_more_clusters_than_users(out_dir, csv_file):
    path = csv_file({"id": [0, 1, 2], "a": [0.1, 0.2, 0.3], "b": [0.3, 0.2, 0.1]})
    expect(
        ConfigError,
        "k: 5 clusters for 3 users",
        out_dir,
        "vfl-kmeans",
        data={"path": path, "key": "id"},
        bounds={"a": [0, 1], "b": [0, 1]},
        method="vfl-nonprivate",
    )


def test_an_unknown_fault_member_is_named_in_words(out_dir):
    expect(
        ConfigError, "no party 'p9'", out_dir, "pattern-count", users=100, fail=["party=p9@round=0"]
    )


def test_the_cli_survives_a_closed_pipe():
    import subprocess
    import sys

    done = subprocess.run(
        f"{sys.executable} -m rayfed.cli list | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
