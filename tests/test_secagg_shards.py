"""The sharded server: S >= 2 server-shard actors split reconstruction and mask removal by user
range, and the round's sum, survivors and dropped lists are bit-identical to the coordinator's
alone (S = 1) — in secure, simulation and dealer modes, with users lost after sharing (so their
keys are reconstructed), on both backends."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rayfed.data import per_user
from rayfed.errors import ConfigError, PartyFailed
from rayfed.faults import parse
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.secagg import FixedPoint, find_params, make_spec, secure_sum, server
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.phases import drop_codes
from rayfed.secagg.phases import schedule as DropoutSchedule
from rayfed.secagg.reference import exact_sum, expected_survivors

N, DIM, SEED = 60, 5, 11
IDS = np.arange(N, dtype=np.int64) * 3 + 2
#: lost after sharing (in U2, not U3: their pairwise keys are reconstructed) and at unmask
#: (in U3, silent while unmasking: their self masks are reconstructed from others' shares)
SCHEDULE = DropoutSchedule(
    explicit={"masked_input": IDS[[0, 7, 29, 30, 59]].tolist(), "unmask": IDS[[3, 44]].tolist()}
)


def _round(mode, shards, backend="local", graph="auto", faults=None, n_cohorts=3):
    dealt = per_user(pa.table({"uid": IDS}), "uid", n_cohorts)
    cohorts = {k: (t, {}) for k, t in dealt.items()}
    params = find_params(N, dropout=0.3, corrupt=0.05, graph=graph)
    spec = make_spec(
        round=0,
        mode=mode,
        registry=IDS,
        params=params,
        encoding=FixedPoint.choose(N, 1.0, 12),
        dim=DIM,
        dropout=SCHEDULE,
    )
    with Federation(
        run_id="shards",
        seed=SEED,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        backend=backend,
        randomness="secure" if mode == "secure" else "seeded",
        server_shards=shards,
        faults=faults,
    ) as fed:
        assert len(fed.shards) == (shards if shards > 1 else 0)
        result = secure_sum(
            fed.cohorts,
            spec,
            synthetic_inputs,
            (DIM, 1.0),
            server=fed.coordinator,
            shards=fed.shards,
        )
    return result, spec, params


def _reference(spec, params, graph_seed):
    """Survivors from the schedule and the round's graph, their inputs summed in exact integers
    (rayfed.secagg.reference): independent of the server, sharded or not."""
    survivors = expected_survivors(
        IDS,
        drop_codes(spec.dropout, SEED, spec.round, IDS),
        NeighbourGraph.build(N, params.degree, params.complete, graph_seed, spec.round),
        params.threshold,
    )
    x = synthetic_inputs(type("Ctx", (), {"seed": SEED})(), spec.round, survivors, DIM, 1.0)
    return survivors, exact_sum(x, spec.encoding.clip, spec.encoding.frac_bits)


def _check(mode, backend, graph):
    runs = {s: _round(mode, s, backend, graph) for s in (1, 2, 3)}
    lost_after_sharing = np.sort(IDS[[0, 7, 29, 30, 59]])
    for s, (result, spec, params) in runs.items():
        survivors, total = _reference(spec, params, result.graph_seed)
        assert np.array_equal(result.survivors, survivors), (mode, s)
        assert np.array_equal(spec.encoding.signed(result.words), total), (mode, s)
        assert np.array_equal(result.dropped_after_sharing, lost_after_sharing), (mode, s)
    if mode != "secure":  # secure mode's keys and graph come from the OS: new in every run
        base = runs[1][0]
        for s in (2, 3):
            assert np.array_equal(runs[s][0].words, base.words)
            assert np.array_equal(runs[s][0].sum, base.sum)
            assert runs[s][0].counts == base.counts


@pytest.mark.parametrize("mode", ["secure", "simulation", "dealer"])
@pytest.mark.parametrize("graph", ["auto", "complete"])
def test_sharded_and_unsharded_servers_give_bit_identical_rounds(mode, graph):
    _check(mode, "local", graph)


@pytest.mark.ray
def test_sharded_server_on_ray(ray_cluster):  # one test: the runs reuse each other's actors
    for mode in ("secure", "simulation", "dealer"):
        _check(mode, "ray", "auto")


def test_shards_own_contiguous_ranges_that_cover_every_position():
    for n in (1, 2, 7, 60, 1001):
        for s in (1, 2, 3, 8):
            ranges = [server.bounds(n, s, i) for i in range(s)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_shard_count_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="server_shards"):
        Federation(
            run_id="x",
            seed=0,
            privacy=PrivacyDeclaration.none("test"),
            backend="local",
            server_shards=bad,
        )


def test_a_shard_that_fails_fails_the_round_with_its_name(monkeypatch):
    original = server.shard_finish
    monkeypatch.setattr(
        server,
        "shard_finish",
        lambda ctx, spec, view, replies: (
            (_ for _ in ()).throw(RuntimeError("disk full"))
            if ctx.name == "shard-1"
            else original(ctx, spec, view, replies)
        ),
    )
    with pytest.raises(PartyFailed, match="shard-1"):
        _round("simulation", 2)


def test_a_cohort_that_dies_is_still_a_dropout_with_shards():
    fault = [parse("cohort=c1@phase=masked_input")]
    result, spec, params = _round("simulation", 2, faults=fault, n_cohorts=6)
    assert result.failed_cohorts == ["c1"]
    unsharded, _, _ = _round("simulation", 1, faults=fault, n_cohorts=6)
    assert np.array_equal(result.words, unsharded.words)
    assert np.array_equal(result.survivors, unsharded.survivors)
    # the dead cohort's users (positions 10..19, dealt in blocks) were lost after sharing
    assert np.isin(IDS[10:20], result.dropped_after_sharing).all()
