"""Fault injection (--fail): a dead party ends the run with PartyFailed naming it; a dead cohort
becomes dropouts and the run completes while enough users survive."""

from __future__ import annotations

import pytest

import rayfed
from rayfed.cli import main
from rayfed.errors import BelowThreshold, ConfigError, PartyFailed
from rayfed.faults import Fault, parse

KMEANS = dict(users=600, k=3, out_dir=None)
SECURE = dict(users=400, cohorts=4, dim=8, out_dir=None)


def test_parse_accepts_the_documented_forms():
    assert parse("party=p1@round=2") == Fault("parties", "p1", round=2)
    assert parse("cohort=3@phase=masked_input") == Fault("cohorts", "c3", phase="masked_input")
    assert parse("cohort=c0@round=0") == Fault("cohorts", "c0", round=0)
    assert parse(" party=bank@phase=setup ") == Fault("parties", "bank", phase="setup")


@pytest.mark.parametrize(
    "text", ["party=p1", "party=p1@round=x", "user=3@round=1", "party=p1@round=1@phase=x", ""]
)
def test_parse_refuses_malformed_specs(text):
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert err.value.field == "fail"


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_dead_party_ends_the_run_naming_it(backend, request, bounded):
    """PartyFailed, not RoundTimeout: the death itself ends the phase, before the deadline could
    (the bounded wait fails the test on a hang)."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    with pytest.raises(PartyFailed) as err:
        bounded(
            300,
            rayfed.run,
            "hfl-kmeans",
            backend=backend,
            fail=["party=p1@round=2"],
            deadline_s=30,
            **KMEANS,
        )
    assert "'p1'" in str(err.value) and "round 2" in str(err.value)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_dead_cohort_becomes_dropouts(backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    result = rayfed.run(
        "secure-sum", backend=backend, fail=["cohort=c2@phase=masked_input"], **SECURE
    )
    (first,) = result.metrics["per_round"]
    assert (first["survivors"], first["dropouts"]) == (300, 100)
    assert "EXACT" in result.headline


def test_too_many_dead_users_abort_below_threshold():
    with pytest.raises(BelowThreshold):
        rayfed.run(
            "secure-sum",
            backend="local",
            fail=["cohort=c1@phase=masked_input"],
            users=300,
            cohorts=3,
            dim=8,
            out_dir=None,
        )


def test_a_fault_must_name_a_member_of_the_run():
    with pytest.raises(ConfigError) as err:
        rayfed.run("hfl-kmeans", backend="local", fail=["party=p7@round=1"], **KMEANS)
    assert err.value.field == "fail" and "p0, p1" in str(err.value)


def test_cli_fail_flag(capsys):
    code = main(
        ["run", "hfl-kmeans", "--backend", "local", "--out", "", "--quiet"]
        + ["--set", "users=600", "--set", "k=3", "--fail", "party=p0@round=1"]
    )
    assert code == 1
    assert "PartyFailed: party 'p0' failed in round 1" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_dead_cohort_restarts_for_the_next_round(backend, request):
    """secure-sum's cohorts keep no state across rounds: a dead one is restarted (its constructor
    re-run on its partition) and its users are back in the next round."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    result = rayfed.run(
        "secure-sum", backend=backend, rounds=2, fail=["cohort=c2@phase=masked_input"], **SECURE
    )
    assert [r["survivors"] for r in result.metrics["per_round"]] == [300, 400]


LFL = dict(users=300, items=40, iterations=3, cohorts=4, secagg_mode="dealer", out_dir=None)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_dead_stateful_cohort_resumes_from_its_checkpoint(backend, request):
    """LFL cohorts keep trained vectors: a cohort killed in iteration 0's masked input loses its
    75 users from that iteration only; restarted and restored from its Arrow checkpoint, it takes
    part in the next iterations. Its users' state is exactly what it was: the run equals one where
    the same 75 users are simply offline in iteration 0 (their masked inputs are missing from the
    same sum either way; the restored u_i then give the same Stage 3 and test error)."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    killed = rayfed.run(
        "federated-mf", backend=backend, fail=["cohort=c1@phase=masked_input"], **LFL
    )
    assert [row["u1"] for row in killed.metrics["iterations"]] == [225, 300, 300]
    assert killed.metrics["lost_cohorts"] == []
    c1 = list(range(75, 150))  # 300 users dealt to 4 cohorts in contiguous blocks
    offline = rayfed.run(
        "federated-mf",
        backend="local",
        population={"outage": c1, "outage_start": 0, "outage_rounds": 1},
        **LFL,
    )
    assert [row["u1"] for row in offline.metrics["iterations"]] == [225, 300, 300]
    assert killed.metrics["test_mse"] == offline.metrics["test_mse"]


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_dead_stateful_cohort_can_be_carried_as_permanent_dropouts(backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    result = rayfed.run(
        "federated-mf",
        backend=backend,
        fail=["cohort=c1@phase=masked_input"],
        lost_users="dropouts",
        **LFL,
    )
    assert [row["u1"] for row in result.metrics["iterations"]] == [225, 225, 225]
    assert result.metrics["lost_cohorts"] == ["c1"]
    assert any("permanent dropouts" in note for note in result.privacy.notes)


SW = dict(users=4_000, cohorts=4, buckets=64, out_dir=None)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_lost_square_wave_cohort_is_restarted_and_asked_again(backend, request):
    """Nothing of a cohort's users left it before it died, so the restarted cohort reports for
    them in the same round: with seeded coins (keyed by user id) the estimate is bit-identical
    to the run without the fault."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    killed = rayfed.run("square-wave", backend=backend, fail=["cohort=c1@phase=perturb"], **SW)
    clean = rayfed.run("square-wave", backend="local", **SW)
    assert killed.metrics["reports"] == [4_000] and killed.metrics["lost_cohorts"] == []
    assert killed.tables["histogram"].equals(clean.tables["histogram"])


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_lost_square_wave_cohort_can_be_carried_as_dropouts(backend, request):
    """lost_users=dropouts: the cohort's 1,000 users are missing, exactly as if they were all
    offline (a population outage of that cohort, an independent path to the same reports)."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    killed = rayfed.run(
        "square-wave",
        backend=backend,
        fail=["cohort=c1@phase=perturb"],
        lost_users="dropouts",
        **SW,
    )
    offline = rayfed.run("square-wave", backend="local", population={"outage_cohort": "c1"}, **SW)
    assert killed.metrics["reports"] == offline.metrics["reports"] == [3_000]
    assert killed.metrics["lost_cohorts"] == ["c1"]
    assert killed.tables["histogram"].equals(offline.tables["histogram"])
    assert any("lost for good" in note for note in killed.privacy.notes)


def test_a_square_wave_cohort_that_dies_again_after_its_restart_is_left_out():
    """Its one restart spent, the cohort is a dropout of the round (listed once) and the note says
    why, not that it was lost for good."""
    result = rayfed.run(
        "square-wave",
        backend="local",
        fail=["cohort=c1@phase=perturb", "cohort=c1@phase=perturb"],
        **SW,
    )
    assert result.metrics["reports"] == [3_000] and result.metrics["lost_cohorts"] == ["c1"]
    assert any("died again after a restart" in note for note in result.privacy.notes)


def test_a_moments_cohort_lost_in_the_variance_half_is_asked_again():
    """SR/PM, lost_users=resume: a cohort killed in round 1 (the variance half) is restarted and
    reports in that round; the moments equal the run without the fault."""
    killed = rayfed.run(
        "square-wave", backend="local", method="sr", fail=["cohort=c2@round=1"], **SW
    )
    clean = rayfed.run("square-wave", backend="local", method="sr", **SW)
    assert killed.metrics["reports"] == clean.metrics["reports"]
    assert sum(clean.metrics["reports"]) == 4_000
    assert killed.tables["moments"].equals(clean.tables["moments"])


def test_a_cohort_lost_in_the_first_half_of_the_moments_stays_lost():
    """SR/PM report in two rounds (mean half, then variance half): a cohort carried as dropouts
    after round 0 is missing from round 1 too."""
    result = rayfed.run(
        "square-wave",
        backend="local",
        method="pm",
        fail=["cohort=c1@round=0"],
        lost_users="dropouts",
        **SW,
    )
    outage = {"outage_cohort": "c1", "outage_rounds": 2}
    offline = rayfed.run("square-wave", backend="local", method="pm", population=outage, **SW)
    assert result.metrics["reports"] == offline.metrics["reports"]
    assert sum(result.metrics["reports"]) == 3_000
    assert result.tables["moments"].equals(offline.tables["moments"])


def test_a_restored_cohort_replaces_only_the_shares_it_drew_in_a_secure_run():
    """A cohort lost after its users' Round-1 inputs are in the sum is restored with a new noise
    secret: it cannot regenerate the shares its dead incarnation added, so it sends no
    replacement for them (they count as Round-2 dropouts, covered by the charge) — a replacement
    built on another secret would not cancel (a max difference of 4.16 in the issue's
    reproduction). A seeded run regenerates them (keyed by the seed) and replaces all."""
    options = dict(LFL, backend="local", fail=["cohort=c1@phase=unmask"])
    options["secagg_mode"] = "simulation"
    secure = rayfed.run("federated-mf", randomness="secure", **options)
    seeded = rayfed.run("federated-mf", **options)
    first = lambda r: r.metrics["iterations"][0]  # noqa: E731
    assert first(secure)["u1"] == first(seeded)["u1"] == 300
    assert first(seeded)["u2"] == 300
    assert first(secure)["u2"] == 225  # c1's 75 users: Round-2 dropouts
    assert [row["u2"] for row in secure.metrics["iterations"][1:]] == [300, 300]
