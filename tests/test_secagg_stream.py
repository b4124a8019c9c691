"""Populations that stream: a cohort generates, masks and sums its users in chunks (issue 29),
and the sum is the one-chunk sum word for word, in every mode, with users dropping at every
phase."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dp_accounting.dp_event import GaussianDpEvent

from rayfed import rng
from rayfed.data import per_user
from rayfed.errors import PartyFailed
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.secagg import FixedPoint, by_user, client, find_params, make_spec, secure_sum
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.phases import drop_codes
from rayfed.secagg.phases import schedule as DropoutSchedule
from rayfed.secagg.reference import exact_sum, expected_survivors

CALLS: list[int] = []  # the sizes of the chunks the input function was called with


@by_user
def _inputs(ctx, round, ids, dim):
    CALLS.append(len(ids))
    return rng.keyed_uniform(ctx.seed, "synthetic", round, ids, dim) * 2 - 1


def _run(mode: str, n: int = 150, dim: int = 5, seed: int = 4, permute: bool = False, fn=_inputs):
    """One round over two cohorts; ``permute``: each cohort's users (``meta["users"]``) in a
    shuffled order, so that positions do not grow with the rows."""
    ids = np.arange(n, dtype=np.int64) * 3 + 2
    cohorts = {k: (t, {}) for k, t in per_user(pa.table({"uid": ids}), "uid", 2).items()}
    if permute:
        shuffle = np.random.default_rng(seed).permutation
        cohorts = {
            k: (t, {"users": shuffle(t.column("user_id").to_numpy())})
            for k, (t, _) in cohorts.items()
        }
    params = find_params(n, dropout=0.4, corrupt=0.05)
    schedule = DropoutSchedule(
        rates={"advertise": 0.05, "share_keys": 0.05, "masked_input": 0.08, "unmask": 0.1}
    )
    spec = make_spec(
        round=0,
        mode=mode,
        registry=ids,
        params=params,
        encoding=FixedPoint.choose(n, 1.0, 12),
        dim=dim,
        dropout=schedule,
    )
    with Federation(
        run_id="stream",
        seed=seed,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
        randomness="secure" if mode == "secure" else "seeded",
    ) as fed:
        result = secure_sum(fed.cohorts, spec, fn, (dim,), server=fed.coordinator)
    survivors = expected_survivors(
        ids,
        drop_codes(schedule, seed, 0, ids),
        NeighbourGraph.build(n, params.degree, params.complete, result.graph_seed, 0),
        params.threshold,
    )
    x = rng.keyed_uniform(seed, "synthetic", 0, survivors, dim) * 2 - 1
    assert np.array_equal(result.survivors, survivors)
    assert np.array_equal(spec.encoding.signed(result.words), exact_sum(x, 1.0, 12))
    return result


@pytest.mark.parametrize("mode", ["dealer", "plain", "simulation"])
def test_chunks_of_seven_users_give_the_one_chunk_sum(monkeypatch, mode):
    monkeypatch.setattr(client, "_CHUNK_ROWS", 10**9)
    CALLS.clear()
    whole = _run(mode)
    assert len(CALLS) == 2  # one call per cohort
    monkeypatch.setattr(client, "_CHUNK_ROWS", 7)
    CALLS.clear()
    chunked = _run(mode)
    # every user who masks (the survivors) once, in chunks of 7 (a cohort's last one shorter)
    assert max(CALLS) == 7 and sum(CALLS) == whole.survivors.size
    assert len(CALLS) > 2 and CALLS.count(7) >= len(CALLS) - 2
    assert np.array_equal(chunked.words, whole.words)
    assert np.array_equal(chunked.survivors, whole.survivors)
    assert 0.6 * 150 < whole.survivors.size < 150  # users dropped at every phase


@pytest.mark.parametrize("mode", ["simulation", "dealer", "secure"])
def test_users_in_any_order_stream_exactly(monkeypatch, mode):
    """A cohort's users given unsorted (``meta["users"]`` shuffled): a pair's partner may sit in
    an earlier chunk than the one that expands the pair's mask (its row is summed already), and
    the chunked sum is still the reference's, exactly."""
    monkeypatch.setattr(client, "_CHUNK_ROWS", 7)
    CALLS.clear()
    result = _run(mode, permute=True)
    assert max(CALLS) == 7 and sum(CALLS) == result.survivors.size
    assert 0.6 * 150 < result.survivors.size < 150


@by_user
def _noisy_inputs(ctx, round, ids, dim):
    """Marked by_user, yet it declares DP noise: a release's noise spans its users, so a chunk's
    share of it is not the function's per-user output."""
    return _inputs(ctx, round, ids, dim), GaussianDpEvent(1.0)


@pytest.mark.parametrize("mode", ["dealer", "simulation"])
def test_a_by_user_function_that_draws_dp_noise_is_refused(mode):
    with pytest.raises(PartyFailed, match="marked by_user must not draw DP noise"):
        _run(mode, n=40, fn=_noisy_inputs)


@pytest.mark.parametrize("complete", [False, True])
def test_neighbour_counts_equal_the_neighbour_table(complete):
    """``count_in`` (unsorted rows, no table for the complete graph) counts what the sorted
    neighbour table holds."""
    graph = NeighbourGraph.build(97, 12, complete, seed=5, round=1)
    member = np.random.default_rng(0).random(97) < 0.6
    pos = np.array([0, 3, 50, 96, 3])
    assert np.array_equal(graph.count_in(pos, member), member[graph.neighbours(pos)].sum(axis=1))


@pytest.mark.parametrize("mode", ["dealer", "simulation"])
def test_secure_sum_streams_its_reference_and_stays_exact(monkeypatch, mode):
    """secure-sum end to end with chunks of 7 users (cohorts, server and the driver's reference):
    exact, and the same sums table as one chunk. Users drop at masked_input too (in U2, not in
    U3), more than a chunk of them: the server removes their pair masks (the dealer's in chunks
    of dropped users) from the streamed sums."""
    import rayfed

    options = dict(backend="local", out_dir=None, users=60, dim=3, mode=mode, dropout=0.1)
    options["population"] = {"rates": {"masked_input": 0.25}}
    monkeypatch.setattr(client, "_CHUNK_ROWS", 10**9)
    whole = rayfed.run("secure-sum", **options)
    monkeypatch.setattr(client, "_CHUNK_ROWS", 7)
    chunked = rayfed.run("secure-sum", **options)
    assert whole.metrics["exact"] and chunked.metrics["exact"]
    assert chunked.tables["sum"].equals(whole.tables["sum"])
    assert chunked.metrics["rounds"] == whole.metrics["rounds"]
    (row,) = chunked.metrics["rounds"]
    assert row["alive_share_keys"] - row["alive_masked_input"] > 7  # lost at masked_input
    assert row["survivors"] == row["alive_masked_input"] < 60


@pytest.mark.parametrize("frac_bits", [12, 58, 62])
def test_the_chunked_reference_sums_like_python_integers(monkeypatch, frac_bits):
    """secure-sum's streamed reference (chunks of 7 users) against Python integers summed one by
    one: exact, beyond int64 too (frac_bits=62: the sums pass 2^63), and with the dtype the
    one-chunk sum has (int64 while n·clip·2^f < 2^62, Python integers from there: 58 is over)."""
    from types import SimpleNamespace

    from rayfed.actors.base import StepContext
    from rayfed.protocols.secure_sum.report import _synthetic_sums
    from rayfed.protocols.secure_sum.steps import synthetic_inputs

    monkeypatch.setattr(client, "_CHUNK_ROWS", 7)
    ctx = StepContext(name="evaluation", role="driver", seed=9)
    survivors, dim = np.arange(300, dtype=np.int64) * 5 + 1, 3
    cfg = SimpleNamespace(clip=1.0, frac_bits=frac_bits)
    clipped, raw = _synthetic_sums(ctx, 2, survivors, dim, cfg)
    x = synthetic_inputs(ctx, 2, survivors, dim, cfg.clip)
    scaled = np.rint(x * 2.0**frac_bits)  # |x| <= clip: nothing to clip; exact (power of two)
    expected = [sum(int(v) for v in scaled[:, c]) for c in range(dim)]
    one_chunk = exact_sum(x, cfg.clip, frac_bits)
    for total in (clipped, raw):
        assert [int(v) for v in total] == expected
        assert total.dtype == one_chunk.dtype == (np.int64 if frac_bits == 12 else object)
    if frac_bits == 62:
        assert max(abs(v) for v in expected) >= 2**63  # beyond int64
