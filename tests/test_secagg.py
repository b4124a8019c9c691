"""Secure aggregation: primitives against official vectors, Shamir and masks as properties, and
whole rounds on the in-process path with dropouts at every phase (the Ray path is in
test_secure_sum.py)."""

from __future__ import annotations

import contextlib
import math
import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayfed import rng
from rayfed.data import per_user
from rayfed.errors import BelowThreshold, ConfigError
from rayfed.faults import parse
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.secagg import (
    FixedPoint,
    ProtocolViolation,
    UnauthenticatedKeys,
    _crypto,
    check_params,
    client,
    find_params,
    make_spec,
    secure_sum,
    server,
    shamir,
)
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.phases import INDEX, NEVER, PHASES, drop_codes
from rayfed.secagg.phases import schedule as DropoutSchedule
from rayfed.secagg.reference import exact_sum, expected_survivors, raw_sum

# --- official vectors --------------------------------------------------------------------------
RFC7748_ALICE_SK = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
RFC7748_ALICE_PK = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
RFC7748_BOB_SK = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"
RFC7748_BOB_PK = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
RFC7748_SHARED = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"


def test_x25519_rfc7748_section_6_1():
    alice, alice_pk = _crypto.keypair(bytes.fromhex(RFC7748_ALICE_SK))
    bob, bob_pk = _crypto.keypair(bytes.fromhex(RFC7748_BOB_SK))
    assert alice_pk.hex() == RFC7748_ALICE_PK and bob_pk.hex() == RFC7748_BOB_PK
    (bob_obj,) = _crypto.public_keys(np.frombuffer(bob_pk, np.uint8)[None])
    (alice_obj,) = _crypto.public_keys(np.frombuffer(alice_pk, np.uint8)[None])
    assert _crypto.shared_secret(alice, bob_obj).hex() == RFC7748_SHARED
    assert _crypto.shared_secret(bob, alice_obj).hex() == RFC7748_SHARED


def test_hkdf_rfc5869_test_case_1():
    okm = _crypto.hkdf(
        b"\x0b" * 22,
        bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        bytes.fromhex("000102030405060708090a0b0c"),
    )
    expected = (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )
    assert okm.hex() == expected[:64]  # a 32-byte HKDF output is the prefix of the 42-byte one


def test_share_encryption_binds_round_and_routing():
    key = bytes(range(32))
    ct = _crypto.encrypt_share(key, b"share", tag=b"t", round=3, sender=1, receiver=2)
    assert _crypto.decrypt_share(key, ct, tag=b"t", round=3, sender=1, receiver=2) == b"share"
    for changed in (
        dict(round=4, sender=1, receiver=2),
        dict(round=3, sender=1, receiver=5),
        dict(round=3, sender=2, receiver=1),
    ):
        with pytest.raises(_crypto.InvalidTag):
            _crypto.decrypt_share(key, ct, tag=b"t", **changed)
    tampered = bytearray(ct)
    tampered[0] ^= 1
    with pytest.raises(_crypto.InvalidTag):
        _crypto.decrypt_share(key, bytes(tampered), tag=b"t", round=3, sender=1, receiver=2)


def test_prg_is_aes_ctr_keystream_and_prf_is_stable():
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seed = bytes(range(32))
    ref = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(bytes(40))
    assert _crypto.expand(seed, 10).tobytes() == ref
    whole = _crypto.prf_blocks(seed, np.arange(100), 3)
    assert np.array_equal(whole[40:42], _crypto.prf_blocks(seed, np.array([40, 41]), 3))


# --- Shamir --------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 20), st.integers(0, 2**32 - 1), st.booleans())
def test_shamir_any_t_subset_reconstructs(t, extra, seed, shared_points):
    gen = np.random.default_rng(seed)
    n_holders = t + extra
    secrets = gen.integers(0, 256, (5, 32), dtype=np.uint8)
    if shared_points:
        points = gen.choice(np.arange(1, 10_000), n_holders, replace=False)
        all_points = np.broadcast_to(points, (5, n_holders))
    else:
        all_points = np.stack(
            [gen.choice(np.arange(1, 10_000), n_holders, replace=False) for _ in range(5)]
        )
        points = all_points
    words = gen.integers(0, 2**63, (5, max(t - 1, 0), shamir.COEF_WORDS), dtype=np.uint64)
    shares = shamir.split(secrets, points, t, words)
    pick = np.stack([gen.choice(n_holders, t, replace=False) for _ in range(5)])
    xs = np.take_along_axis(all_points, pick, axis=1)
    ys = np.take_along_axis(shares, pick[:, :, None], axis=1)
    assert np.array_equal(shamir.reconstruct(xs, ys), secrets)


def test_leave_one_out_coefficients_equal_direct_ones():
    points = np.arange(5, 60, 5)
    table = shamir.lagrange_leave_one_out(points)
    for r in range(points.size):
        direct = shamir.lagrange_at_zero(np.delete(points, r)[None])[0]
        assert np.array_equal(np.delete(table[r], r), direct)


# --- graph, parameters, encoding, dropouts -------------------------------------------------------
def test_harary_graph_is_symmetric_regular_and_keyed():
    g = NeighbourGraph.build(50, 8, False, seed=1, round=0)
    nb = g.neighbours(np.arange(50))
    assert nb.shape == (50, 8) and not np.any(nb == np.arange(50)[:, None])
    for u in range(50):
        for v in nb[u]:
            assert u in g.neighbours(np.array([v]))[0]
            assert g.are_neighbours(np.array([u]), np.array([v]))[0]
    assert not np.array_equal(
        nb, NeighbourGraph.build(50, 8, False, seed=1, round=1).neighbours(np.arange(50))
    )


def test_parameter_finder_meets_its_bounds():
    for n in (100, 1000, 10_000):
        p = find_params(n, dropout=0.3, corrupt=0.05, sigma=40, eta=30)
        assert p.log2_security_failure <= -40 and p.log2_correctness_failure <= -30
        assert p.complete or (p.degree % 2 == 0 and p.threshold <= p.degree)
        assert p.min_survivors == n - math.ceil(0.3 * n)
    small = find_params(
        20, dropout=0.3, corrupt=0.05
    )  # k=8: 6 dropouts leave >= 2 of 8, 1 corrupt < t
    assert (small.degree, small.threshold) == (8, 2)
    complete = find_params(20, dropout=0.3, corrupt=0.05, graph="complete")
    assert complete.complete and complete.threshold == 20 - 1 - 6
    assert check_params(1000, 74, 24, dropout=0.3).log2_correctness_failure <= -30
    with pytest.raises(ConfigError, match="even"):
        check_params(1000, 73, 24, dropout=0.3)
    with pytest.raises(ConfigError, match="threshold"):
        find_params(10, dropout=0.8, corrupt=0.15, graph="complete")


def test_fixed_point_roundtrip_and_overflow_is_a_config_error():
    enc = FixedPoint.choose(1000, 2.0, 16)
    assert enc.modulus_bits == (1000 * 2 * 2**16).bit_length() + 1  # 2^(b-1) > n·R
    x = np.array([[-2.5, 0.1234567, 1.9999]])
    assert np.allclose(enc.decode(enc.encode(x)[0]), [-2.0, 0.1234567, 1.9999], rtol=0, atol=2**-17)
    with pytest.raises(ConfigError, match="modulus_bits.*overflow"):
        FixedPoint.choose(1000, 2.0, 16, modulus_bits=20)
    with pytest.raises(ConfigError, match="frac_bits"):
        FixedPoint.choose(10**6, 1e6, 40)


def test_dropout_schedule_is_keyed_by_user_and_round():
    sched = DropoutSchedule(
        rates={"masked_input": 0.3, "unmask": 0.2},
        explicit={"advertise": [5]},
    )
    ids = np.arange(2000)
    drop = sched.drop_phase(7, 0, ids)
    assert drop[5] == 0
    assert np.array_equal(drop[100:150], sched.drop_phase(7, 0, ids[100:150]))
    assert not np.array_equal(drop, sched.drop_phase(7, 1, ids))
    share = np.mean(drop == PHASES.index("masked_input"))
    assert abs(share - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 2000)
    with pytest.raises(ConfigError, match="population.rates.after_lunch"):
        DropoutSchedule(rates={"after_lunch": 0.1})


# --- whole rounds, in process ----------------------------------------------------------------------
def _inputs(ctx, round, ids, dim):
    return rng.keyed_uniform(ctx.seed, "synthetic", round, ids, dim) * 2 - 1


def _run(
    n=40,
    dim=6,
    mode="simulation",
    n_cohorts=2,
    schedule=None,
    graph="auto",
    dropout=0.4,
    seed=3,
    backend="local",
    threat_model="semi-honest",
):
    """One round; threat_model=malicious adds the consistency round and the PKI, with t sized
    for a malicious server."""
    ids = np.arange(n, dtype=np.int64) * 7 + 1
    cohorts = {k: (t, {}) for k, t in per_user(pa.table({"uid": ids}), "uid", n_cohorts).items()}
    params = find_params(n, dropout=dropout, corrupt=0.05, graph=graph, threat_model=threat_model)
    enc = FixedPoint.choose(n, 1.0, 12)
    spec = make_spec(
        round=0,
        mode=mode,
        registry=ids,
        params=params,
        encoding=enc,
        dim=dim,
        dropout=schedule or DropoutSchedule(),
    )
    with Federation(
        run_id="t",
        seed=seed,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        backend=backend,
        randomness="secure" if mode == "secure" else "seeded",
    ) as fed:
        result = secure_sum(fed.cohorts, spec, _inputs, (dim,), server=fed.coordinator)
        transcript = list(fed.transcript.rows)
    reference = _reference(spec, seed, params, graph_seed=result.graph_seed)
    return result, _exact(result, spec, reference), params, transcript


def _reference(spec, seed, params, lost_at=None, graph_seed=None):
    """The independent reference (rayfed.secagg.reference): survivors from the schedule and the
    round's graph (the run's seed, or the server's published draw in secure mode), never from the
    result; their inputs summed in exact integers."""
    ids = spec.registry
    graph_seed = seed if graph_seed is None else graph_seed
    survivors = expected_survivors(
        ids,
        drop_codes(spec.dropout, seed, spec.round, ids),
        NeighbourGraph.build(ids.size, params.degree, params.complete, graph_seed, spec.round),
        params.threshold,
        lost_at,
    )
    x = _inputs(type("Ctx", (), {"seed": seed})(), spec.round, survivors, spec.dim)
    return survivors, exact_sum(x, spec.encoding.clip, spec.encoding.frac_bits)


def _exact(result, spec, expected) -> bool:
    """The protocol's survivors and decoded sum both equal the reference's."""
    survivors, total = expected
    return np.array_equal(result.survivors, survivors) and np.array_equal(
        spec.encoding.signed(result.words), total
    )


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.floats(0, 0.12), min_size=4, max_size=4),
    st.sampled_from(["auto", "complete"]),
    st.integers(0, 1000),
)
def test_sum_is_exact_for_any_dropout_pattern_that_leaves_enough_users(rates, graph, seed):
    schedule = DropoutSchedule(rates=dict(zip(PHASES.names, rates, strict=True)))
    ids = np.arange(40, dtype=np.int64) * 7 + 1
    stay = int(np.sum(schedule.drop_phase(seed, 0, ids) == NEVER))
    min_survivors = find_params(40, dropout=0.4, corrupt=0.05, graph=graph).min_survivors
    try:
        result, exact, params, _ = _run(schedule=schedule, graph=graph, seed=seed)
    except BelowThreshold as err:
        # an abort is right only if too few users stay, or one user's shares fall short of t
        assert stay < min_survivors or err.what.startswith("shares of"), (err, stay)
        return
    assert stay >= min_survivors
    assert exact
    assert result.survivors.size >= params.min_survivors


def test_exactly_min_survivors_completes_and_one_fewer_aborts():
    n, params = 40, find_params(40, dropout=0.4, corrupt=0.05)
    survivors_needed = params.min_survivors
    ids = np.arange(n) * 7 + 1
    exactly = DropoutSchedule(explicit={"unmask": ids[: n - survivors_needed].tolist()})
    result, exact, _, _ = _run(schedule=exactly)
    assert exact
    one_less = DropoutSchedule(explicit={"unmask": ids[: n - survivors_needed + 1].tolist()})
    with pytest.raises(BelowThreshold, match="unmask"):
        _run(schedule=one_less)


def test_a_user_lost_at_share_keys_advertised_but_shared_nothing():
    """Five users lost at share_keys are in U1 (the server's advertise count) and not in U2 (its
    share_keys count); lost at masked_input they are in U2 and not in U3. Either way the sum
    is the reference's, which derives U2 on its own."""
    ids = np.arange(40) * 7 + 1
    gone = ids[[2, 9, 17, 25, 33]].tolist()
    expected = {
        "share_keys": {"advertise": 40, "share_keys": 35, "masked_input": 35},
        "masked_input": {"advertise": 40, "share_keys": 40, "masked_input": 35},
    }
    for phase, counts in expected.items():
        result, exact, _, _ = _run(schedule=DropoutSchedule(explicit={phase: gone}))
        assert exact and not np.isin(gone, result.survivors).any(), phase
        assert {k: result.counts[k] for k in counts} == counts, phase


def test_results_do_not_depend_on_the_number_of_cohorts():
    schedule = DropoutSchedule(rates={"masked_input": 0.1, "unmask": 0.1})
    runs = [_run(n_cohorts=k, schedule=schedule)[0] for k in (1, 2, 4)]
    for other in runs[1:]:
        assert np.array_equal(other.words, runs[0].words)
        assert np.array_equal(other.survivors, runs[0].survivors)


@pytest.mark.parametrize(
    "graph,pattern", [("auto", "random"), ("complete", "random"), ("auto", "neighbourhood")]
)  # on the complete graph one user's neighbourhood is everyone: the global quorum covers it
def test_dealer_and_plain_modes_give_bit_identical_sums_to_simulation(graph, pattern):
    n = 40 if pattern == "random" else 120
    if pattern == "random":
        schedule = DropoutSchedule(rates={"masked_input": 0.1, "unmask": 0.15})
    else:  # most of one user's neighbours never advertise: that user must drop out in every mode
        params = find_params(n, dropout=0.4, corrupt=0.05, graph=graph)
        graph_ = NeighbourGraph.build(n, params.degree, params.complete, 3, 0)
        nb = graph_.neighbours(np.array([0]))[0]
        gone = (np.arange(n) * 7 + 1)[nb[: len(nb) - params.threshold + 1]]
        schedule = DropoutSchedule(explicit={"advertise": gone.tolist()})
    sim = _run(n=n, mode="simulation", schedule=schedule, graph=graph)[0]
    if pattern == "neighbourhood":
        assert not np.isin(
            1, sim.survivors
        )  # user 0 (id 1) could not protect its secrets: dropped out
    for mode in ("dealer", "plain"):
        other = _run(n=n, mode=mode, schedule=schedule, graph=graph)[0]
        assert np.array_equal(other.words, sim.words) and np.array_equal(
            other.survivors, sim.survivors
        )
    # secure mode draws its graph from the OS: exact against the reference on that graph
    assert _run(n=n, mode="secure", schedule=schedule, graph=graph)[1]


def test_driver_calls_per_phase_follow_cohorts_not_users():
    for n in (40, 120):
        _, _, _, rows = _run(n=n, n_cohorts=3)
        masked = [r for r in rows if r["phase"] == "masked_input"]
        assert len(masked) == 3  # one message per cohort, whatever the number of users


def test_a_tampered_share_ciphertext_is_rejected(monkeypatch):
    original = server.route_shares

    def tamper(ctx, spec, replies):
        out = original(ctx, spec, replies)
        first = next(iter(out.values())).payload
        first["ct"][0, 5] ^= 0x40
        return out

    monkeypatch.setattr(server, "route_shares", tamper)
    schedule = DropoutSchedule(explicit={"unmask": [1]})
    with pytest.raises(ProtocolViolation, match="failed authentication"):
        _run(schedule=schedule)


def test_a_request_for_both_shares_of_a_user_is_refused(monkeypatch):
    original = server.collect_masked

    def greedy(ctx, spec, replies):
        msg = original(ctx, spec, replies)
        msg.payload["dropped"] = np.union1d(msg.payload["dropped"], msg.payload["survivors"][:1])
        return msg

    monkeypatch.setattr(server, "collect_masked", greedy)
    with pytest.raises(ProtocolViolation, match="both shares"):
        _run()


@pytest.mark.parametrize("value", [shamir.P, 2**62, -1])
def test_a_share_outside_the_field_is_refused_before_combining(monkeypatch, value):
    """A share of p or more (or negative) from a cohort would wrap the int64 products of the
    combination into a wrong secret, or a wrong sum: refused with ProtocolViolation."""
    original = server.finish

    def out_of_field(ctx, spec, replies):
        first = sorted(replies)[0]
        share = np.array(replies[first]["share"], dtype=np.int64)
        share[:, 3] = value  # every share this cohort holds, so some are combined
        return original(ctx, spec, {**replies, first: {**replies[first], "share": share}})

    monkeypatch.setattr(server, "finish", out_of_field)
    with pytest.raises(ProtocolViolation, match=r"share outside \[0, p\)"):
        _run(schedule=DropoutSchedule(explicit={"unmask": [1]}))


@pytest.mark.parametrize("mode", ["simulation", "secure"])
def test_the_consistency_round_keeps_the_exact_sum(mode):
    """threat_model=malicious adds a round (users sign U3, the unmask request carries the signatures)
    and changes nothing else: the sum and survivors still match the independent reference."""
    schedule = DropoutSchedule(rates={"masked_input": 0.1, "unmask": 0.2})
    result, exact, params, transcript = _run(mode=mode, schedule=schedule, threat_model="malicious")
    assert exact
    phases = [row["phase"] for row in transcript]
    assert phases.index("consistency") < phases.index("collect_signatures") < phases.index("unmask")


def _survivor_moved_to_dropped(request: dict) -> int:
    """A malicious server's request: one survivor u (its masked input is in the sum) is listed
    as dropped, so u's neighbours reveal u's mask key — with u's self-mask shares from other
    users, u's input would be exposed. Returns u's position."""
    u = int(request["survivors"][0])
    request["survivors"] = request["survivors"][1:]
    request["dropped"] = np.union1d(request["dropped"], [u])
    return u


def test_without_the_consistency_round_a_forged_survivors_list_is_answered(monkeypatch):
    """The attack the consistency round stops: shown U3 minus u, u's neighbours reveal their
    shares of u's mask key although u's masked input is in the sum."""
    original_request, original_finish = server.collect_masked, server.finish
    forged, answers = [], {}

    def forging(ctx, spec, replies):
        msg = original_request(ctx, spec, replies)
        forged.append(_survivor_moved_to_dropped(msg.payload))
        return msg

    def capture(ctx, spec, replies):
        answers.update(replies)
        return original_finish(ctx, spec, replies)

    monkeypatch.setattr(server, "collect_masked", forging)
    monkeypatch.setattr(server, "finish", capture)
    with contextlib.suppress(BelowThreshold):  # the sum is wrong; the shares are out already
        _run(schedule=DropoutSchedule(explicit={"unmask": [1]}))
    (u,) = forged
    key_shares_of_u = sum(
        int(np.sum((a["owner"] == u) & (a["kind"] == client.KIND_KEY))) for a in answers.values()
    )
    assert key_shares_of_u > 0


def test_the_consistency_round_refuses_a_forged_survivors_list(monkeypatch):
    """With threat_model=malicious the users signed the true U3; the forged list carries signatures
    that do not verify on it, so no user reveals a share."""
    original = server.collect_signatures

    def forging(ctx, spec, replies):
        msg = original(ctx, spec, replies)
        _survivor_moved_to_dropped(msg.payload)
        return msg

    monkeypatch.setattr(server, "collect_signatures", forging)
    with pytest.raises(ProtocolViolation, match="another survivors list than was signed"):
        _run(schedule=DropoutSchedule(explicit={"unmask": [1]}), threat_model="malicious")


def test_the_consistency_round_refuses_lists_that_differ_by_cohort(monkeypatch):
    """The equivocating server: cohort c0 is shown the true U3 (its users reveal u's self-mask
    shares), c1 is shown U3 without u (its users would reveal u's key shares). Each cohort signs
    its own list, and each list carries only its cohort's signatures: neither reaches more than
    (n + c)/2, so nobody reveals anything. (With a threshold of t signatures, t = 4 here, both
    halves would have answered and u's input been exposed.)"""
    original_consistency, original_unmask = client.consistency, client.unmask
    signed = {}

    def equivocating_list(ctx, spec, request):
        u3 = np.asarray(request["survivors"])
        shown = u3 if ctx.name == "c0" else u3[1:]
        msg = original_consistency(ctx, spec, {"survivors": shown})
        signed[ctx.name] = (shown, msg.payload["pos"], msg.payload["sig"])
        return msg

    def unmask_with_own_list(ctx, spec, request):
        shown, signers, sigs = signed[ctx.name]
        u2 = ctx.state["secagg"][spec.round].u2
        forged = {
            "survivors": shown,
            "dropped": np.setdiff1d(u2, shown),
            "signers": signers,
            "signatures": sigs,
        }
        return original_unmask(ctx, spec, forged)

    monkeypatch.setattr(client, "consistency", equivocating_list)
    monkeypatch.setattr(client, "unmask", unmask_with_own_list)
    with pytest.raises(ProtocolViolation, match="only 20 users signed"):
        _run(mode="secure", threat_model="malicious")


def test_authenticated_keys_leave_the_honest_sum_bit_identical():
    """threat_model=malicious signs every user's keys at advertise and verifies them in share_keys:
    an honest server's round gives the same words and survivors as a round without it, and the
    key table carries a signature per row that verifies under the signer's own key."""
    schedule = DropoutSchedule(rates={"masked_input": 0.1, "unmask": 0.15})
    tables = []
    original = server.collect_keys

    def keep(ctx, spec, replies, **beacon):
        msg = original(ctx, spec, replies, **beacon)
        tables.append(msg.payload)
        return msg

    plain = _run(schedule=schedule)[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server, "collect_keys", keep)
        signed, exact, _, _ = _run(schedule=schedule, threat_model="malicious")
    assert exact
    assert np.array_equal(signed.words, plain.words)
    assert np.array_equal(signed.survivors, plain.survivors)
    (table,) = tables
    spec = make_spec(
        round=0,
        mode="simulation",
        registry=np.arange(40) * 7 + 1,
        params=find_params(40, dropout=0.4, corrupt=0.05),
        encoding=FixedPoint.choose(40, 1.0, 12),
        dim=6,
    )
    for row, pos in enumerate(table["pos"]):
        # the signed bytes, spelled out here rather than taken from spec.keys_message
        ident = int(pos * 7 + 1).to_bytes(8, "little", signed=True)
        message = b"rayfed|round=0|keys|" + ident + table["c_pk"][row].tobytes()
        message += table["s_pk"][row].tobytes()
        assert message == spec.keys_message(pos * 7 + 1, table["c_pk"][row], table["s_pk"][row])
        sig = table["key_sig"][row].tobytes()
        assert _crypto.verify(table["sign_pk"][row].tobytes(), sig, message)
        assert not _crypto.verify(table["sign_pk"][row].tobytes(), sig, message[:-1] + b"?")


SERVER_C_SK, SERVER_C_PK = _crypto.keypair(bytes(range(32)))  # the malicious server's own keys


def _substituting_server(monkeypatch, column, resign=False):
    """A malicious server that shows cohort c0 a key table where one user v of c1 has the
    server's X25519 key in its ``column`` row (c1, shown the true table, sees nothing wrong).
    With ``resign`` it also puts its own signing key in v's row and signs the forged row with it,
    so the row verifies under the server's table; only the PKI key (from the driver) exposes it.
    Returns {"victim": v's id, "pos": v's position, "table": the true table} once it ran."""
    original, seen = client.share_keys, {}

    def shown_a_forged_table(ctx, spec, table, *pki):
        if ctx.name == "c0":
            own = ctx.state["secagg"][spec.round].pos
            pos = int(np.setdiff1d(table["pos"], own)[0])
            row = int(np.searchsorted(table["pos"], pos))
            seen.update(victim=int(spec.registry[pos]), pos=pos, table=table)
            table = {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in table.items()}
            table[column][row] = np.frombuffer(SERVER_C_PK, np.uint8)
            if resign:
                sk, pk = _crypto.signing_keypair(bytes(range(1, 33)))
                c_pk, s_pk = table["c_pk"][row], table["s_pk"][row]
                message = spec.keys_message(spec.registry[pos], c_pk, s_pk)
                table["sign_pk"][row] = np.frombuffer(pk, np.uint8)
                table["key_sig"][row] = np.frombuffer(sk.sign(message), np.uint8)
                assert _crypto.verify(pk, table["key_sig"][row].tobytes(), message)
        return original(ctx, spec, table, *pki)

    monkeypatch.setattr(client, "share_keys", shown_a_forged_table)
    return seen


def test_without_authenticated_keys_a_substituted_key_leaks_shares(monkeypatch):
    """The attack: shown the server's key as v's c_pk, v's neighbours in c0 encrypt their shares
    for v under a key the server agrees too — it decrypts them (and v only fails later)."""
    seen = _substituting_server(monkeypatch, "c_pk")
    routed = {}
    original = server.route_shares

    def capture(ctx, spec, replies):
        routed.update(spec=spec, replies=replies)
        return original(ctx, spec, replies)

    monkeypatch.setattr(server, "route_shares", capture)
    with contextlib.suppress(ProtocolViolation):  # v cannot decrypt at unmask: too late
        _run()
    spec, c0 = routed["spec"], routed["replies"]["c0"]
    table = seen["table"]
    to_v = c0["receiver"] == seen["pos"]
    opened = 0
    for sender, ct in zip(c0["sender"][to_v], c0["ct"][to_v], strict=True):
        peer = _crypto.public_keys(table["c_pk"][np.searchsorted(table["pos"], [sender])])[0]
        key = _crypto.hkdf(_crypto.shared_secret(SERVER_C_SK, peer), _crypto.INFO_SHARE, spec.salt)
        plain = _crypto.decrypt_share(
            key, ct.tobytes(), tag=spec.tag, round=0, sender=int(sender), receiver=seen["pos"]
        )
        opened += len(plain) == client.PLAINTEXT_BYTES
    assert opened > 0


@pytest.mark.parametrize("column", ["c_pk", "s_pk"])
def test_a_substituted_public_key_is_refused_before_any_share_is_sent(monkeypatch, column):
    seen, routed = _substituting_server(monkeypatch, column), []
    monkeypatch.setattr(server, "route_shares", lambda *args: routed.append(args))
    with pytest.raises(UnauthenticatedKeys) as err:
        _run(threat_model="malicious")
    assert not routed  # refused in share_keys: no share reached the server
    assert err.value.users == [seen["victim"]] and err.value.cohort == "c0"
    assert str(seen["victim"]) in str(err.value)
    again = pickle.loads(pickle.dumps(err.value))  # how it crosses from a Ray actor
    assert type(again) is UnauthenticatedKeys and again.users == [seen["victim"]]


def test_a_server_that_also_replaces_the_signing_key_is_refused_by_the_pki(monkeypatch):
    """The forged row verifies under the signing key in the server's own table (checked inside
    the fake server), but the users check it against the key the driver handed them."""
    seen = _substituting_server(monkeypatch, "c_pk", resign=True)
    with pytest.raises(UnauthenticatedKeys) as err:
        _run(mode="secure", threat_model="malicious")
    assert err.value.users == [seen["victim"]]


def _shown_to(monkeypatch, cohort, edit):
    """A malicious server that shows ``cohort`` (None: every cohort) the key table
    ``edit(ctx, spec, table)`` returns (a copy it may change) and every other cohort the true one."""
    original = client.share_keys

    def shown(ctx, spec, table, *pki):
        if cohort in (None, ctx.name):
            table = {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in table.items()}
            table = edit(ctx, spec, table)
        return original(ctx, spec, table, *pki)

    monkeypatch.setattr(client, "share_keys", shown)


def test_a_table_that_hides_some_peers_is_refused_when_u2_names_them(monkeypatch):
    """The server leaves three of a c0 user's neighbours out of c0's table (so a row nobody in c0
    verified would sit where they were looked up) and sends the honest U2, which names them:
    c0 refuses at masked_input instead of masking with keys it never checked."""

    def hide_peers(ctx, spec, table):
        st = ctx.state["secagg"][spec.round]
        neighbours = spec.graph(int(table["graph_seed"])).neighbours(st.pos[:1])[0]
        keep = ~np.isin(table["pos"], np.setdiff1d(neighbours, st.pos)[:3])
        return {k: v[keep] if isinstance(v, np.ndarray) else v for k, v in table.items()}

    _shown_to(monkeypatch, "c0", hide_peers)
    with pytest.raises(ProtocolViolation, match="outside the key table"):
        _run(threat_model="malicious")


def _zero_key_forgery(message: bytes) -> bytes:
    """An Ed25519 signature that verifies under the all-zero public key (a point of small order
    h: [k]A vanishes whenever 4 divides k = H(R, A, M)), found in a few tries."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    order = 2**252 + 27742317777372353535851937790883648493
    for i in range(256):
        seed = hashlib.sha256(b"forge%d" % i).digest()
        h = hashlib.sha512(seed).digest()
        a = (int.from_bytes(h[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
        r = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
        k = int.from_bytes(hashlib.sha512(r + bytes(32) + message).digest(), "little") % order
        if k % 4 == 0:
            return r + (a % order).to_bytes(32, "little")
    raise AssertionError("no forgery found")


def test_a_row_for_a_user_the_pki_does_not_know_is_refused(monkeypatch):
    """User 8 (position 1) drops before advertise; the server adds a row for it to c1's table
    with its own keys and a signature that verifies under the PKI's empty (all-zero) slot. Only
    the 'known to the PKI' rule stops it: refused, naming the user, before any share is sent."""
    routed = []

    def add_phantom(ctx, spec, table):
        c_pk = np.frombuffer(SERVER_C_PK, np.uint8)
        s_pk = np.frombuffer(_crypto.keypair(bytes(range(2, 34)))[1], np.uint8)
        message = spec.keys_message(8, c_pk, s_pk)
        sig = _zero_key_forgery(message)
        assert _crypto.verify(bytes(32), sig, message), "OpenSSL now refuses small-order keys"
        at = int(np.searchsorted(table["pos"], 1))
        row = {"pos": 1, "c_pk": c_pk, "s_pk": s_pk, "sign_pk": np.zeros(32, np.uint8)}
        row["key_sig"] = np.frombuffer(sig, np.uint8)
        return {k: np.insert(v, at, row[k], axis=0) if k in row else v for k, v in table.items()}

    _shown_to(monkeypatch, "c1", add_phantom)
    monkeypatch.setattr(server, "route_shares", lambda *args: routed.append(args))
    schedule = DropoutSchedule(explicit={"advertise": [8]})
    with pytest.raises(UnauthenticatedKeys) as err:
        _run(schedule=schedule, threat_model="malicious", graph="complete")
    assert err.value.users == [8] and not routed


def test_survivor_signatures_are_checked_against_the_pki_not_the_table(monkeypatch):
    """An equivocating server also puts its own signing keys in each cohort's table for the
    other cohort's users and signs each cohort's list for them: were the U3 signatures checked
    against the table's keys, each cohort would count enough and answer — both shares of a
    user. Against the PKI's keys the forged signatures do not count: refused."""
    import hashlib

    def server_key(pos):
        return _crypto.signing_keypair(hashlib.sha256(b"server%d" % pos).digest())

    def own_signing_keys(ctx, spec, table):
        own = ctx.state["secagg"][spec.round].pos
        for row, p in enumerate(table["pos"].tolist()):
            if p not in own:
                table["sign_pk"][row] = np.frombuffer(server_key(p)[1], np.uint8)
        return table

    _shown_to(monkeypatch, None, own_signing_keys)
    originals, signed = (client.consistency, client.unmask), {}

    def equivocating(ctx, spec, request):
        u3 = np.asarray(request["survivors"])
        shown = u3 if ctx.name == "c0" else u3[1:]
        msg = originals[0](ctx, spec, {"survivors": shown})
        signed[ctx.name] = (shown, msg.payload["pos"], msg.payload["sig"])
        return msg

    def with_forged_signatures(ctx, spec, request):
        shown, signers, sigs = signed[ctx.name]
        others = np.setdiff1d(shown, signers)
        message = spec.survivors_message(shown)
        forged = [np.frombuffer(server_key(p)[0].sign(message), np.uint8) for p in others]
        st = ctx.state["secagg"][spec.round]
        request = {
            "survivors": shown,
            "dropped": np.setdiff1d(st.u2, shown),
            "signers": np.concatenate([signers, others]),
            "signatures": np.concatenate([sigs, np.stack(forged)]),
        }
        return originals[1](ctx, spec, request)

    monkeypatch.setattr(client, "consistency", equivocating)
    monkeypatch.setattr(client, "unmask", with_forged_signatures)
    with pytest.raises(ProtocolViolation, match="signed the survivors list"):
        _run(mode="secure", threat_model="malicious")


def test_a_graph_seed_other_than_the_runs_is_refused_outside_secure_mode(monkeypatch):
    _shown_to(monkeypatch, "c0", lambda ctx, spec, table: {**table, "graph_seed": 4})
    with pytest.raises(ProtocolViolation, match="graph seed is not the run's"):
        _run(seed=3)


def test_a_malformed_key_table_is_refused_not_indexed(monkeypatch):
    def swap_last_rows(ctx, spec, table):
        return {
            k: v[[*range(len(v) - 2), -1, -2]] if isinstance(v, np.ndarray) else v
            for k, v in table.items()
        }

    _shown_to(monkeypatch, "c0", swap_last_rows)
    with pytest.raises(ProtocolViolation, match="not increasing"):
        _run(threat_model="malicious")


def test_a_secure_round_draws_its_graph_from_the_os_after_the_keys():
    """SecAgg+'s bounds assume users are corrupted independently of the graph: in secure mode the
    server draws the permutation's seed from the OS once everyone advertised (fresh every run,
    not the run seed); simulation keeps the seed (reproducible)."""
    secure = [_run(mode="secure")[0].graph_seed for _ in range(2)]
    assert secure[0] != secure[1] and 3 not in secure
    assert _run(mode="simulation", seed=3)[0].graph_seed == 3


def test_a_secure_consistency_round_takes_its_graph_from_the_pki_beacon(monkeypatch):
    """With a PKI, the graph's seed is the beacon's (drawn by the trusted side, not the server),
    and the sum is exact against a reference built on that graph."""
    import rayfed.secagg as secagg

    monkeypatch.setattr(secagg, "_beacon", lambda spec: 987654321)
    result, exact, _, _ = _run(mode="secure", threat_model="malicious")
    assert result.graph_seed == 987654321 and exact


def test_a_server_that_picks_its_own_graph_seed_is_refused(monkeypatch):
    """A grinding server replaces the beacon's seed by one of its choice in the key table: every
    user checks the table's seed against the beacon the PKI handed it, before any share is sent."""
    original, routed = server.collect_keys, []

    def grinding(ctx, spec, replies, beacon=None):
        msg = original(ctx, spec, replies, beacon=beacon)
        msg.payload["graph_seed"] = beacon + 1
        return msg

    monkeypatch.setattr(server, "collect_keys", grinding)
    monkeypatch.setattr(server, "route_shares", lambda *args: routed.append(args))
    with pytest.raises(ProtocolViolation, match="not the PKI beacon's"):
        _run(mode="secure", threat_model="malicious")
    assert not routed


def test_out_of_order_messages_are_refused_by_client_and_server():
    """The client accepts only the next stage of its round, the server only its next phase."""
    from rayfed.actors.base import StepContext
    from rayfed.secagg import client

    ids = np.arange(12)
    params = find_params(12, dropout=0.3, corrupt=0.05)
    spec = make_spec(
        round=0,
        mode="simulation",
        registry=ids,
        params=params,
        encoding=FixedPoint.choose(12, 1.0, 8),
        dim=2,
    )
    ctx = StepContext(name="c0", role="cohort", seed=1, table=pa.table({"user_id": ids}))
    with pytest.raises(ProtocolViolation, match="share_keys request arrived in no round"):
        client.share_keys(ctx, spec, {})
    client.advertise(ctx, spec)
    with pytest.raises(ProtocolViolation, match="masked_input request arrived in stage advertise"):
        client.masked_input(ctx, spec, {"u2": ids}, _inputs, (2,))
    with pytest.raises(ProtocolViolation, match="unmask request arrived in stage advertise"):
        client.unmask(ctx, spec, {"survivors": ids, "dropped": ids[:0]})
    coordinator = StepContext(name="coordinator", role="coordinator", seed=1)
    server.collect_keys(
        coordinator,
        spec,
        {
            "c0": {
                "pos": ids,
                "c_pk": np.zeros((12, 32), np.uint8),
                "s_pk": np.zeros((12, 32), np.uint8),
            }
        },
    )
    for step in (server.collect_masked, server.finish):
        with pytest.raises(ProtocolViolation, match="server is in phase share_keys"):
            step(coordinator, spec, {})


def test_secure_mode_draws_its_keys_from_the_os_and_simulation_from_the_seed():
    from rayfed.actors.base import StepContext
    from rayfed.secagg import client

    ids = np.arange(12)
    params = find_params(12, dropout=0.3, corrupt=0.05)

    def keys(mode):
        spec = make_spec(
            round=0,
            mode=mode,
            registry=ids,
            params=params,
            encoding=FixedPoint.choose(12, 1.0, 8),
            dim=2,
        )
        randomness = "secure" if mode == "secure" else "seeded"
        ctx = StepContext(
            name="c0",
            role="cohort",
            seed=1,
            table=pa.table({"user_id": ids}),
            randomness=randomness,
        )
        return client.advertise(ctx, spec).payload["c_pk"]

    assert not np.array_equal(keys("secure"), keys("secure"))
    assert np.array_equal(keys("simulation"), keys("simulation"))


@pytest.mark.parametrize("mode,randomness", [("secure", "seeded"), ("simulation", "secure")])
def test_a_mode_that_contradicts_the_actors_randomness_is_refused(mode, randomness):
    """secure mode on seeded actors would label seeded keys secure; simulation on secure ones the
    reverse: both are refused before any key is drawn."""
    from rayfed.actors.base import StepContext
    from rayfed.secagg import client

    ids = np.arange(12)
    spec = make_spec(
        round=0,
        mode=mode,
        registry=ids,
        params=find_params(12, dropout=0.3, corrupt=0.05),
        encoding=FixedPoint.choose(12, 1.0, 8),
        dim=2,
    )
    ctx = StepContext(
        name="c0", role="cohort", seed=1, table=pa.table({"user_id": ids}), randomness=randomness
    )
    with pytest.raises(ProtocolViolation, match="mode="):
        client.advertise(ctx, spec)


def test_a_round_is_never_started_twice():
    from rayfed.actors.base import StepContext
    from rayfed.secagg import client

    ids = np.arange(12)
    spec = make_spec(
        round=0,
        mode="simulation",
        registry=ids,
        params=find_params(12, dropout=0.3),
        encoding=FixedPoint.choose(12, 1.0, 8),
        dim=2,
    )
    ctx = StepContext(name="c0", role="cohort", seed=1, table=pa.table({"user_id": ids}))
    client.advertise(ctx, spec)
    with pytest.raises(ProtocolViolation, match="already started"):
        client.advertise(ctx, spec)


@pytest.mark.parametrize("phase", ["share_keys", "masked_input", "unmask"])
def test_a_cohort_killed_in_process_becomes_dropouts(phase):
    ids = np.arange(60, dtype=np.int64) * 7 + 1
    cohorts = {k: (t, {}) for k, t in per_user(pa.table({"uid": ids}), "uid", 4).items()}
    params = find_params(60, dropout=0.3, corrupt=0.05)
    enc = FixedPoint.choose(60, 1.0, 12)
    spec = make_spec(
        round=0,
        mode="simulation",
        registry=ids,
        params=params,
        encoding=enc,
        dim=3,
    )
    with Federation(
        run_id="t",
        seed=3,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
        faults=[parse(f"cohort=c2@phase={phase}")],
    ) as fed:
        result = secure_sum(fed.cohorts, spec, _inputs, (3,), server=fed.coordinator)
    assert result.failed_cohorts == ["c2"]
    c2 = cohorts["c2"][0]["user_id"].to_numpy()
    lost = np.full(ids.size, NEVER)
    lost[np.searchsorted(ids, c2)] = INDEX[phase]  # the planned death, not the result
    assert _exact(result, spec, _reference(spec, 3, params, lost, result.graph_seed))
    in_sum = np.isin(c2, result.survivors).any()
    assert in_sum == (phase == "unmask")  # dead before its masked input: not in the sum


def test_the_reference_catches_a_lost_survivor_and_a_wrapped_sum():
    """The check can fail: a survivor set one user short, or a sum off by the modulus, is caught."""
    result, exact, params, _ = _run()
    assert exact
    spec = make_spec(
        round=0,
        mode="simulation",
        registry=np.arange(40, dtype=np.int64) * 7 + 1,
        params=params,
        encoding=FixedPoint.choose(40, 1.0, 12),
        dim=6,
    )
    survivors, total = _reference(spec, 3, params)
    assert not _exact(result, spec, (survivors[1:], total))
    wrapped = total.copy()
    wrapped[0] -= 1 << spec.encoding.modulus_bits
    assert not _exact(result, spec, (survivors, wrapped))


def test_the_raw_sum_is_the_clipped_sum_without_the_clip():
    """raw_sum adds the unclipped values on the same grid (hand-computed here); inside the
    domain it equals exact_sum, outside they differ by what the clip removed; values whose
    grid points overflow float64 (or int64 sums) are added as exact Python integers."""
    x = np.array([[0.25, -3.0], [0.5, 0.75], [-2.0, 0.125]])
    assert exact_sum(x, 1.0, 3).tolist() == [(2 + 4 - 8), (-8 + 6 + 1)]  # in eighths
    assert raw_sum(x, 3).tolist() == [(2 + 4 - 16), (-24 + 6 + 1)]
    inside = np.array([[0.3, -0.7], [1.0, -1.0]])
    assert np.array_equal(raw_sum(inside, 16), exact_sum(inside, 1.0, 16))
    assert raw_sum(np.array([[2.0**61], [2.0**61]]), 2).tolist() == [2**64]  # beyond int64
    assert raw_sum(np.array([[1e300], [1.0]]), 16).tolist() == [(int(1e300) << 16) + (1 << 16)]
    assert raw_sum(np.array([[1e306], [-0.5]]), 16).tolist() == [(int(1e306) << 16) - (1 << 15)]


def test_the_raw_sum_of_integers_is_exact_and_reads_back_rounded_once():
    """Integer inputs are added as integers (cast to float64, 2^62 + 1 became 2^62 and the 1 was
    lost); to_float rounds an exact grid sum once — its integer may be beyond float64 while the
    sum is not (2e304·2^16) — and gives ±inf where the sum itself is beyond float64's range."""
    from rayfed.secagg.reference import to_float

    ints = np.array([[2**62 + 1], [-(2**62)], [1]], dtype=np.int64)
    assert raw_sum(ints, 16).tolist() == [2 << 16]
    assert raw_sum(np.array([[3, -1], [2, 5]]), 4).tolist() == [5 << 4, 4 << 4]
    assert raw_sum(np.array([[2**62], [2**62]], dtype=np.int64), 2).tolist() == [2**65]
    big = raw_sum(np.array([[1e304], [1e304], [0.5]]), 16)
    assert to_float(big, 16).tolist() == [2e304]  # (2e304·2^16 + 2^15) / 2^16, rounded once
    over = raw_sum(np.array([[1.5e308, -1.5e308], [1.5e308, -1.5e308]]), 16)
    assert to_float(over, 16).tolist() == [np.inf, -np.inf]
    small = raw_sum(np.array([[0.25, -3.0], [0.5, 0.75]]), 3)  # int64: the float64 path
    assert small.dtype == np.int64 and to_float(small, 3).tolist() == [0.75, -2.25]


def test_the_finder_takes_the_smallest_degree_and_largest_threshold():
    """Not circular: one step smaller degree or one larger threshold breaks a bound."""
    p = find_params(1000, dropout=0.3, corrupt=0.05, sigma=40, eta=30)
    for t in range(1, p.degree - 1):  # no threshold works with degree k - 2
        weaker = check_params(1000, p.degree - 2, t, dropout=0.3)
        assert weaker.log2_security_failure > -40 or weaker.log2_correctness_failure > -30
    assert check_params(1000, p.degree, p.threshold + 1, dropout=0.3).log2_correctness_failure > -30


def test_x25519_rejects_a_low_order_peer_key():
    """RFC 7748 §6.1: an all-zero shared secret must be refused (cryptography raises ValueError)."""
    sk, _ = _crypto.keypair(bytes.fromhex(RFC7748_ALICE_SK))
    (zero,) = _crypto.public_keys(np.zeros((1, 32), np.uint8))
    with pytest.raises(ValueError):
        _crypto.shared_secret(sk, zero)
