"""The sharded server: S >= 2 server-shard actors split reconstruction and mask removal by user
range, and the round's sum, survivors and dropped lists are bit-identical to the coordinator's
alone (S = 1) — in secure, simulation and dealer modes, with users lost after sharing (so their
keys are reconstructed), on both backends."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

import rayfed
from rayfed import sizing
from rayfed.data import per_user
from rayfed.errors import BelowThreshold, ConfigError, PartyFailed
from rayfed.faults import parse
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.secagg import (
    FixedPoint,
    ProtocolViolation,
    find_params,
    make_spec,
    secure_sum,
    server,
)
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


def _round(
    mode, shards, backend="local", graph="auto", faults=None, n_cohorts=3, threat="semi-honest"
):
    dealt = per_user(pa.table({"uid": IDS}), "uid", n_cohorts)
    cohorts = {k: (t, {}) for k, t in dealt.items()}
    params = find_params(N, dropout=0.3, corrupt=0.05, graph=graph, threat_model=threat)
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


def _check(mode, runs):
    """``runs``: shards -> (result, spec, params) of one mode."""
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
    _check(mode, {s: _round(mode, s, "local", graph) for s in (1, 2, 3)})


@pytest.mark.ray
def test_sharded_server_on_ray(ray_cluster):
    # one test, the most shards first: later runs reuse the earlier runs' actors
    modes = ("secure", "simulation", "dealer")
    runs = {(mode, s): _round(mode, s, "ray") for s in (3, 2, 1) for mode in modes}
    for mode in modes:
        _check(mode, {s: runs[mode, s] for s in (1, 2, 3)})


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

    def failing(ctx, *args):
        if ctx.name == "shard-1":
            raise RuntimeError("disk full")
        return original(ctx, *args)

    monkeypatch.setattr(server, "shard_finish", failing)
    with pytest.raises(PartyFailed, match="shard-1.*disk full"):
        _round("simulation", 2)


def test_each_shard_is_sent_only_the_shares_of_the_users_it_owns(monkeypatch):
    original, seen = server.shard_finish, {}

    def recording(ctx, spec, view, replies, owned):
        seen[ctx.name] = (owned, np.concatenate([r["owner"] for r in replies.values()]))
        return original(ctx, spec, view, replies, owned)

    monkeypatch.setattr(server, "shard_finish", recording)
    _round("simulation", 3)
    assert [seen[f"shard-{i}"][0] for i in range(3)] == [(0, 20), (20, 40), (40, 60)]
    owners = set()
    for (lo, hi), owner in seen.values():
        assert owner.size and ((owner >= lo) & (owner < hi)).all()
        owners |= set(owner.tolist())
    # U2 is every position (nobody was lost before sharing): each owner's shares reached a shard
    assert owners == set(range(N))


def test_each_shard_routes_only_the_shares_its_users_receive(monkeypatch):
    original, seen = server.shard_route, {}

    def recording(ctx, spec, cohort_of, replies, owned):
        seen[ctx.name] = (owned, np.concatenate([r["receiver"] for r in replies.values()]))
        return original(ctx, spec, cohort_of, replies, owned)

    monkeypatch.setattr(server, "shard_route", recording)
    _round("simulation", 2)
    assert [seen[f"shard-{i}"][0] for i in range(2)] == [(0, 30), (30, 60)]
    for (lo, hi), receiver in seen.values():
        assert receiver.size and ((receiver >= lo) & (receiver < hi)).all()


def test_the_consistency_round_on_a_sharded_server_is_bit_identical():
    one = _round("simulation", 1, threat="malicious")[0]
    two = _round("simulation", 2, threat="malicious")[0]
    assert np.array_equal(two.words, one.words) and np.array_equal(two.survivors, one.survivors)
    assert two.counts == one.counts and "consistency" in two.counts


def test_a_cohort_that_dies_is_still_a_dropout_with_shards():
    fault = [parse("cohort=c1@phase=masked_input")]
    result, spec, params = _round("simulation", 2, faults=fault, n_cohorts=6)
    assert result.failed_cohorts == ["c1"]
    unsharded, _, _ = _round("simulation", 1, faults=fault, n_cohorts=6)
    assert np.array_equal(result.words, unsharded.words)
    assert np.array_equal(result.survivors, unsharded.survivors)
    # the dead cohort's users (positions 10..19, dealt in blocks) were lost after sharing
    assert np.isin(IDS[10:20], result.dropped_after_sharing).all()


def test_secure_sum_server_shards_option_gives_the_same_tables():
    kw = dict(users=60, dim=4, seed=5, out_dir=None, backend="local", dropout=0.1, cohorts=3)
    one = rayfed.run("secure-sum", server_shards=1, **kw)
    three = rayfed.run("secure-sum", server_shards=3, **kw)
    assert one.metrics["server_shards"] == 1 and three.metrics["server_shards"] == 3
    assert one.metrics["exact"] and three.metrics["exact"]
    assert three.tables["sum"].equals(one.tables["sum"])
    assert "reconstruct" in three.metrics["phase_seconds"]


@pytest.mark.auto_server_shards
def test_auto_shards_follow_the_cluster_cpus(monkeypatch):
    for cpus, shards in [(1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (64, 16), (256, 16)]:
        monkeypatch.setattr(sizing, "cluster_cpus", lambda c=cpus: c)
        assert sizing.default_server_shards("auto") == shards, cpus
    assert sizing.default_server_shards(5) == 5


def test_auto_is_one_shard_in_the_test_suite_unless_a_test_opts_in(monkeypatch):
    """tests/conftest.py: outside a test marked auto_server_shards, "auto" is the coordinator
    alone even on a 16-CPU machine (the threat and golden tests patch its server steps)."""
    monkeypatch.setattr(sizing, "cluster_cpus", lambda: 16)
    assert sizing.default_server_shards("auto") == 1
    assert sizing.default_server_shards(3) == 3


def test_lfl_round_one_on_a_sharded_server_is_bit_identical():
    kw = dict(users=120, items=20, iterations=2, backend="local", out_dir=None, dropout=0.1)
    kw["secagg_mode"] = "simulation"
    one = rayfed.run("federated-mf", server_shards=1, **kw)
    two = rayfed.run("federated-mf", server_shards=2, **kw)
    assert one.tables
    for name in one.tables:
        assert two.tables[name].equals(one.tables[name]), name
    assert two.metrics["test_mse"] == one.metrics["test_mse"]
    assert one.metrics["server_shards"] == 1 and two.metrics["server_shards"] == 2


@pytest.mark.parametrize("bad", [0, "many", 1.5])
def test_a_bad_server_shards_option_names_it(bad):
    with pytest.raises(ConfigError, match="server_shards"):
        rayfed.run("secure-sum", users=20, dim=2, backend="local", out_dir=None, server_shards=bad)


def test_shard_ranges_follow_the_numeric_index_at_twelve_shards():
    """At S >= 11 a text sort puts shard-10 before shard-2: shard-i must own range i, whatever the
    order the names come in (the federation's group lists them text-sorted)."""
    n, s = 120, 12
    names = sorted(f"shard-{i}" for i in range(s))  # the group's order: shard-0, shard-1, shard-10…
    ranges = server.shard_ranges(n, names)
    assert ranges == {f"shard-{i}": (10 * i, 10 * (i + 1)) for i in range(s)}
    assert list(ranges) == [f"shard-{i}" for i in range(s)]


def _transcript(monkeypatch, shards):
    """One simulation round's transcript rows, and what each cohort's share_keys and unmask
    answered in full (before any split by shard), and the coordinator's finish context."""
    from rayfed.secagg import client

    full = {"share_keys": {}, "unmask": {}, "finish_context": []}
    share_keys, unmask, context = client.share_keys, client.unmask, server.finish_context

    def sharing(ctx, *args):
        out = share_keys(ctx, *args)
        full["share_keys"][ctx.name] = out.payload
        return out

    def unmasking(ctx, *args):
        out = unmask(ctx, *args)
        full["unmask"][ctx.name] = out.payload
        return out

    def viewing(ctx, *args):
        out = context(ctx, *args)
        full["finish_context"].append(getattr(out, "payload", out))
        return out

    monkeypatch.setattr(client, "share_keys", sharing)
    monkeypatch.setattr(client, "unmask", unmasking)
    monkeypatch.setattr(server, "finish_context", viewing)
    dealt = per_user(pa.table({"uid": IDS}), "uid", 3)
    params = find_params(N, dropout=0.3, corrupt=0.05)
    spec = make_spec(
        round=0,
        mode="simulation",
        registry=IDS,
        params=params,
        encoding=FixedPoint.choose(N, 1.0, 12),
        dim=DIM,
        dropout=SCHEDULE,
    )
    with Federation(
        run_id="shards",
        seed=SEED,
        cohorts={k: (t, {}) for k, t in dealt.items()},
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
        server_shards=shards,
    ) as fed:
        result = secure_sum(
            fed.cohorts,
            spec,
            synthetic_inputs,
            (DIM, 1.0),
            server=fed.coordinator,
            shards=fed.shards,
        )
        rows = list(fed.transcript.rows)
    return rows, full, result


def _split_bytes(payload, lo, hi, by):
    """Bytes of a payload's part for the range [lo, hi) of ``by`` (pos kept whole), computed
    here from the sizes alone: 8 per int64 key, the arrays' buffers."""
    rows = (payload[by] >= lo) & (payload[by] < hi)
    return sum(
        len(k) + (np.asarray(v).nbytes if k == "pos" else np.asarray(v)[rows].nbytes)
        for k, v in payload.items()
    )


def test_the_sharded_transcript_has_one_row_per_receiver_with_its_bytes(monkeypatch):
    """S = 2: every message is one row per (sender, receiver) with that part's own bytes (not the
    member's total on every row), the shards' routed shares reach every cohort, and the context
    broadcasts (coordinator -> each shard) and partial corrections (each shard -> coordinator) are
    in it. The total is S = 1's plus exactly the sharded server's extra messages, computed here."""
    s, base_rows, _, base = 2, *_transcript(monkeypatch, 1)
    monkeypatch.undo()
    rows, full, result = _transcript(monkeypatch, s)
    assert np.array_equal(result.words, base.words)
    keys = [(r["phase"], r["sender"], r["receiver"]) for r in rows]
    assert len(keys) == len(set(keys)), "one row per (phase, sender, receiver)"
    shard_names = [f"shard-{i}" for i in range(s)]
    ranges = {name: server.bounds(N, s, i) for i, name in enumerate(shard_names)}
    by_key = {(r["phase"], r["sender"], r["receiver"]): r["bytes"] for r in rows}
    cohorts = sorted(full["share_keys"])
    for phase, by in (("share_keys", "receiver"), ("unmask", "owner")):
        for c in cohorts:
            for name, (lo, hi) in ranges.items():
                want = _split_bytes(full[phase][c], lo, hi, by)
                assert by_key[(phase, c, name)] == want, (phase, c, name)
    for name in shard_names:
        for c in cohorts:
            assert (("route_shares", name, c)) in by_key
        assert ("route_shares", name, "coordinator") in by_key
        assert ("route_context", "coordinator", name) in by_key
        assert ("finish_context", "coordinator", name) in by_key
        assert (
            by_key[("reconstruct", name, "coordinator")]
            == len("correction") + 8 * DIM + len("responders") + 8
        )
    total = sum(r["bytes"] for r in rows)
    base_total = sum(r["bytes"] for r in base_rows)
    u2 = 8 * base.counts["share_keys"]
    extra = 0
    for phase in ("share_keys", "unmask"):  # each shard's part repeats the keys and pos
        for c in cohorts:
            payload = full[phase][c]
            extra += (s - 1) * sum(len(k) for k in payload) + (s - 1) * payload["pos"].nbytes
    # routed shares: each shard's message to a cohort repeats sender/receiver/ct's keys; U2 leaves
    # the routes (S = 1: in every cohort's message) for the coordinator's broadcast (as many), and
    # every shard sends it to the coordinator
    extra += len(cohorts) * (s - 1) * len("senderreceiverct") + s * (len("u2") + u2)
    cohort_of = sum(
        len(c) + 8 * len(t) for c, t in per_user(pa.table({"uid": IDS}), "uid", 3).items()
    )
    extra += s * cohort_of  # route_context: every cohort's user positions, to each shard
    (view,) = full["finish_context"]
    u1 = view["u1"].size
    assert view["s_pk"].nbytes == 32 * u1  # the n·32 B key table goes to every shard
    extra += s * rayfed.actors.base.nbytes_of(view)
    extra += s * (len("correction") + 8 * DIM + len("responders") + 8)  # the partials
    assert total == base_total + extra


@pytest.mark.parametrize("mode", ["simulation", "dealer"])
def test_too_few_shares_abort_is_the_same_for_any_number_of_shards(mode):
    """Weak parameters (k = 8, t = 6, as allow_weak_params would let through) and 12 users silent
    at unmask: some owners keep fewer than t shares. The abort names the fewest shares of all
    owners (at the lowest such position), as the coordinator alone does: a shard reports its
    shortfall and the coordinator picks the global one (was: the first failing shard's own)."""
    dealt = per_user(pa.table({"uid": IDS}), "uid", 3)
    params = dataclasses.replace(find_params(N, dropout=0.3, corrupt=0.05), degree=8, threshold=6)
    unmask = [2, 4, 11, 13, 17, 22, 23, 26, 33, 49, 51, 57]
    spec = make_spec(
        round=0,
        mode=mode,
        registry=IDS,
        params=params,
        encoding=FixedPoint.choose(N, 1.0, 12),
        dim=DIM,
        dropout=DropoutSchedule(
            explicit={"masked_input": IDS[[1, 7, 46]].tolist(), "unmask": IDS[unmask].tolist()}
        ),
    )
    errors = {}
    for s in (1, 2, 3):
        with Federation(
            run_id="shards",
            seed=SEED,
            cohorts={k: (t, {}) for k, t in dealt.items()},
            privacy=PrivacyDeclaration.none("test"),
            backend="local",
            server_shards=s,
        ) as fed:
            with pytest.raises(BelowThreshold) as err:
                secure_sum(
                    fed.cohorts,
                    spec,
                    synthetic_inputs,
                    (DIM, 1.0),
                    server=fed.coordinator,
                    shards=fed.shards,
                )
        e = err.value
        errors[s] = (e.phase, e.alive, e.threshold, e.needed, e.what)
    # the coordinator alone: 4 shares of position 25, the fewest (graph and drops are seeded)
    assert errors[1] == ("unmask", 4, 6, "Shamir threshold t", "shares of the user at position 25")
    assert errors[2] == errors[1] and errors[3] == errors[1]


def test_the_private_mean_reports_its_server_shards():
    """The DP path (private mean estimation) reports server_shards as the exact sum does."""
    kw = dict(users=40, dim=4, seed=5, out_dir=None, backend="local", cohorts=2)
    kw.update(dp_mechanism="gaussian", epsilon=1.0, mode="simulation")
    for s in (1, 2):
        assert rayfed.run("secure-sum", server_shards=s, **kw).metrics["server_shards"] == s


def test_shards_that_count_different_responders_are_a_protocol_violation(monkeypatch):
    """A shard that answers another responder count than the rest: the coordinator refuses the
    round as a ProtocolViolation naming both counts (was: a ValueError unpacking them)."""
    finish = server.shard_finish

    def lying(ctx, *args):
        out = finish(ctx, *args)
        if ctx.name == "shard-1":
            out.payload["responders"] += 1
        return out

    monkeypatch.setattr(server, "shard_finish", lying)
    with pytest.raises(ProtocolViolation, match="counted different responders"):
        _round("simulation", 2)


def test_shards_is_a_reserved_member_name():
    """'shards' addresses the server shards' group (to="shards"): no party or cohort takes it."""
    with pytest.raises(ConfigError, match="reserved"):
        Federation(
            run_id="t",
            seed=0,
            cohorts={"shards": (pa.table({"uid": [1]}), {})},
            privacy=PrivacyDeclaration.none("test"),
            backend="local",
        )
