"""The threat model decides secure aggregation's parameters (issue 26): the malicious bounds
checked against an independent computation, and the isolation attack of a malicious server run
end to end in secure-sum and in LFL federated-mf — it recovers the victim's input under
semi-honest parameters and nothing under ``threat_model=malicious``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

import rayfed
from rayfed.actors.base import Message, StepContext
from rayfed.data import per_user
from rayfed.errors import BelowThreshold, ConfigError
from rayfed.secagg import (
    ProtocolViolation,
    _crypto,
    check_params,
    client,
    find_params,
    server,
    shamir,
)
from rayfed.secagg.server import Phase


# --- the bounds, against a direct sum of hypergeometric probabilities ----------------------------
def _hyp_tail(population: int, good: int, draws: int, at_least: int) -> Fraction:
    """P[Hyp(population, good, draws) >= at_least], exactly (math.comb, no scipy)."""
    total = math.comb(population, draws)
    top = min(good, draws)
    return Fraction(
        sum(
            math.comb(good, i) * math.comb(population - good, draws - i)
            for i in range(max(at_least, 0), top + 1)
        ),
        total,
    )


def _log2(p: Fraction) -> float:
    return -math.inf if p == 0 else math.log2(p.numerator) - math.log2(p.denominator)


def _independent(n: int, k: int, t: int, dropout: float, corrupt: float, malicious: bool):
    """(log2 share-security bound, log2 correctness bound) from the formulas of the docstring."""
    c, d = math.ceil(corrupt * n), math.ceil(dropout * n)
    need = 2 * t - k if malicious else t
    security = n * _hyp_tail(n - 1, c, k, need) if need > 0 else Fraction(n)
    # fewer than t of the k neighbours among the n - 1 - d survivors
    correctness = n * (1 - _hyp_tail(n - 1, n - 1 - d, k, t))
    return _log2(security), _log2(correctness)


@pytest.mark.parametrize("n", [200, 1000])
def test_malicious_parameters_meet_both_bounds_computed_independently(n):
    """The finder's k and t under malicious: the isolation bound n·P[Hyp(n-1, ⌈γn⌉, k) >= 2t-k]
    and the correctness bound, each recomputed with exact rationals, meet 2^-40 and 2^-30; t - 1
    misses security or k - 2 has no t that meets both. Semi-honest parameters are today's."""
    p = find_params(n, dropout=0.3, corrupt=0.05, threat_model="malicious")
    assert p.threat_model == "malicious" and not p.complete
    security, correctness = _independent(n, p.degree, p.threshold, 0.3, 0.05, True)
    windows = p.log2_security_failure  # the reported bound is max(isolation, connectivity)
    assert security <= -40 and correctness <= -30
    assert windows == pytest.approx(max(security, windows), abs=1e-6)
    assert p.log2_correctness_failure == pytest.approx(correctness, abs=1e-6)
    if security != -math.inf:
        assert p.log2_security_failure == pytest.approx(security, abs=1e-6)
    assert 2 * p.threshold > p.degree + 0  # t > (k + c)/2 even with no corrupt neighbour
    # t + 1 breaks correctness (the finder takes the largest t)
    assert _independent(n, p.degree, p.threshold + 1, 0.3, 0.05, True)[1] > -30
    # no smaller even k has a t that meets both bounds
    k = p.degree - 2
    assert not any(
        s <= -40 and c <= -30
        for s, c in (_independent(n, k, t, 0.3, 0.05, True) for t in range(k // 2 + 1, k + 1))
    )
    semi = find_params(n, dropout=0.3, corrupt=0.05)
    assert semi.threat_model == "semi-honest"
    assert (semi.degree, semi.threshold) == {200: (42, 11), 1000: (74, 24)}[n]  # the issue's


def test_semi_honest_threshold_fails_the_malicious_bound():
    """The mutant 'keep the semi-honest t under malicious': its isolation bound is 1 per user
    (2t <= k: no corrupt neighbour needed), and check_params refuses it."""
    semi = find_params(200, dropout=0.3)
    security, _ = _independent(200, semi.degree, semi.threshold, 0.3, 0.05, True)
    assert security == pytest.approx(math.log2(200))
    with pytest.raises(ConfigError, match="isolate") as err:
        check_params(200, semi.degree, semi.threshold, dropout=0.3, threat_model="malicious")
    assert err.value.field == "threshold"


def test_complete_graph_malicious_threshold_is_exact():
    """Complete graph: (n - 1 + ⌈γn⌉)/2 < t <= n - 1 - ⌈δn⌉ exactly; an empty range names
    tolerated_dropout and the largest δ that works."""
    p = find_params(60, dropout=0.3, corrupt=0.05, graph="complete", threat_model="malicious")
    assert p.complete and p.threshold == 59 - 18
    assert 2 * p.threshold > 59 + 3
    with pytest.raises(ConfigError) as err:
        find_params(100, dropout=0.48, corrupt=0.05, threat_model="malicious")
    assert (
        err.value.field == "tolerated_dropout" and "tolerated_dropout <= 0.46" in err.value.allowed
    )
    p = find_params(100, dropout=0.46, corrupt=0.05, graph="complete", threat_model="malicious")
    assert p.threshold == 53 and 2 * 53 > 99 + 5


# --- the isolation attack ------------------------------------------------------------------------
VICTIM_COHORT = "victim"


def _deal_victim_alone(original):
    """per_user with the smallest user id in a cohort of its own, so that the server's message
    from that cohort is the victim's own masked input (a real server sees every y_u alone; rayfed
    cohorts forward their users' sum)."""

    def deal(table: pa.Table, key: str, n_cohorts: int):
        ids = table.column(key).to_numpy()
        victim = ids.min()
        mask = pa.array(ids == victim)
        rest = original(table.filter(pa.compute.invert(mask)), key, max(1, n_cohorts - 1))
        alone = original(table.filter(mask), key, 1)["c0"]
        return {**rest, VICTIM_COHORT: alone}

    return deal


@dataclasses.dataclass
class Isolation:
    """The malicious server of issue 26 (Why 1), as steps of its own:

    1. route_shares shows the victim v a U2 holding only t of its k neighbours (S);
    2. collect_masked keeps v's masked input y_v and declares S dropped: U3' = U3 \\ S; the
       victim is sent no further request (it would refuse a list naming users outside its U2);
    3. the signing round runs on U3' (no server-side quorum: a malicious server skips its own);
    4. from the answers it reconstructs b_v from the self-mask shares of v's other neighbours and
       s_w (w in S) from the key shares of S's other neighbours, and removes them from y_v.
    """

    threshold_override: tuple[int, int] | None = None  # (k, t): the mutant's semi-honest sizing
    #: the spec's quorum instead of the plan's (1: the clients' quorum check off, so that a test
    #: sees what the threshold alone stops; the attack drops more users than the quorum allows)
    quorum: int | None = None
    #: c: the victim's last c neighbours are corrupt (the stronger variant): the server puts them
    #: in S but keeps them in U3 — they give the victim's self-mask shares AND hand the server
    #: their own mask keys — so only S's t - c honest members are declared dropped
    corrupt: int = 0
    corrupt_keys: dict = dataclasses.field(default_factory=dict)  # position -> s_sk bytes
    s: np.ndarray | None = None
    victim: int | None = None
    y: np.ndarray | None = None
    self_shares: int = 0
    needed: int = 0
    recovered: np.ndarray | None = None
    signatures: int = 0
    corrupt_nb: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    dropped: np.ndarray | None = None

    def install(self, monkeypatch):
        route, masked = server.route_shares, server.collect_masked
        consistency, unmask, keys = client.consistency, client.unmask, client.share_keys

        def route_shares(ctx, spec, replies):
            out = route(ctx, spec, replies)
            st = ctx.state["secagg_server"][spec.round]
            if spec.round == 0 and VICTIM_COHORT in out:
                (v,) = st.cohort_of[VICTIM_COHORT]
                nb = spec.graph(st.graph_seed).neighbours(np.array([v]))[0]
                self.corrupt_nb = nb[nb.size - self.corrupt :]
                self.dropped = nb[: spec.threshold - self.corrupt]  # S's honest members
                self.victim, self.s = int(v), np.union1d(self.dropped, self.corrupt_nb)
                payload = out[VICTIM_COHORT].payload
                payload["u2"] = np.setdiff1d(payload["u2"], np.setdiff1d(nb, self.s))
            return out

        def collect_masked(ctx, spec, replies):
            msg = masked(ctx, spec, replies)
            if spec.round != 0:
                return msg
            self.y = np.asarray(replies[VICTIM_COHORT]["y"])[0].astype(np.uint64)
            st = ctx.state["secagg_server"][spec.round]
            st.u3 = np.setdiff1d(st.u3, self.dropped)  # S's honest members "dropped"
            if spec.consistency:
                return Message("sign_request", {"survivors": st.u3}, to="cohorts")
            return Message("unmask_request", server._unmask_request(st), to="cohorts")

        def collect_signatures(ctx, spec, replies):
            st = ctx.state["secagg_server"][spec.round]
            signers = server._concat(replies, "pos", np.int64)
            self.signatures = int(signers.size)
            st.phase = Phase.UNMASK
            payload = {
                **server._unmask_request(st),
                "signers": signers,
                "signatures": server._concat(replies, "sig", np.uint8, 64),
            }
            return Message("unmask_request", payload, to="cohorts")

        def finish(ctx, spec, replies):
            st = ctx.state["secagg_server"][spec.round]
            self._attack(spec, st, replies)
            raise BelowThreshold("unmask", 0, 1, spec.round, what="(the attacker stops here)")

        def silent(kind):
            def step(ctx, spec, request):
                if spec.round == 0 and ctx.name == VICTIM_COHORT:  # never sent the request
                    client._state(ctx, spec, kind)
                    empty = {"pos": np.zeros(0, np.int64)}
                    if kind == "consistency":
                        return Message(
                            "signatures",
                            {**empty, "sig": np.zeros((0, 64), np.uint8)},
                            to="coordinator",
                        )
                    return Message("unmask_shares", {**empty, **_NO_SHARES}, to="coordinator")
                return (consistency if kind == "consistency" else unmask)(ctx, spec, request)

            return step

        def share_keys(ctx, spec, table, *args, **kw):
            st = ctx.state["secagg"][spec.round]  # what a corrupt user hands over
            for p, key in zip(st.pos[st.drop > client.ADVERTISE], st.s_sk_bytes, strict=True):
                self.corrupt_keys[int(p)] = key.tobytes()
            return keys(ctx, spec, table, *args, **kw)

        if self.corrupt:
            monkeypatch.setattr(client, "share_keys", share_keys)
        monkeypatch.setattr(server, "route_shares", route_shares)
        monkeypatch.setattr(server, "collect_masked", collect_masked)
        monkeypatch.setattr(server, "collect_signatures", collect_signatures)
        monkeypatch.setattr(server, "finish", finish)
        monkeypatch.setattr(client, "consistency", silent("consistency"))
        monkeypatch.setattr(client, "unmask", silent("unmask"))
        if self.threshold_override is not None or self.quorum is not None:
            original = rayfed.secagg.make_spec
            changes = {} if self.quorum is None else {"min_survivors": self.quorum}
            if self.threshold_override is not None:
                changes.update(zip(("degree", "threshold"), self.threshold_override, strict=True))

            def mutant_spec(**kw):
                return dataclasses.replace(original(**kw), **changes)

            for module in (
                "rayfed.protocols.secure_sum.driver",
                "rayfed.protocols.federated_mf.lfl.driver",
            ):
                monkeypatch.setattr(importlib.import_module(module), "make_spec", mutant_spec)

    def _attack(self, spec, st, replies):
        owner = server._concat(replies, "owner", np.int64)
        holder = server._concat(replies, "holder", np.int64)
        kind = server._concat(replies, "kind", np.uint8)
        share = server._concat(replies, "share", np.int64, shamir.CHUNKS)

        def shares_of(u, k):
            rows = (owner == u) & (kind == k)
            return holder[rows] + 1, share[rows]

        xs, ys = shares_of(self.victim, client.KIND_SELF)
        self.self_shares, self.needed = int(xs.size), spec.threshold
        if xs.size == 0:
            return
        # with fewer than t shares this interpolates a polynomial of too low a degree: the best a
        # server can do, and (Shamir) independent of b_v; mostly not even a 256-bit value
        try:
            b_v = shamir.reconstruct(xs[None, : spec.threshold], ys[None, : spec.threshold])[0]
        except ValueError:  # "shares are inconsistent"
            return
        total = self.y - _crypto.expand(b_v.tobytes(), spec.dim, spec.word_dtype).astype(np.uint64)
        pk_v = _crypto.public_keys(st.s_pk[np.searchsorted(st.u1, [self.victim])])[0]
        for w in self.s.tolist():
            if w in self.corrupt_nb:
                s_w = self.corrupt_keys[w]
            else:
                wx, wy = shares_of(w, client.KIND_KEY)
                s_w = shamir.reconstruct(wx[None, : spec.threshold], wy[None, : spec.threshold])
                s_w = s_w[0].tobytes()
            sk, _ = _crypto.keypair(s_w)
            seed = _crypto.hkdf(_crypto.shared_secret(sk, pk_v), _crypto.INFO_MASK, spec.salt)
            mask = _crypto.expand(seed, spec.dim, spec.word_dtype).astype(np.uint64)
            total = total - mask if self.victim > w else total + mask  # v added sign(v, w)·mask
        self.recovered = spec.encoding.decode(spec.encoding.reduce(total))


_NO_SHARES = {
    "holder": np.zeros(0, np.int64),
    "owner": np.zeros(0, np.int64),
    "kind": np.zeros(0, np.uint8),
    "share": np.zeros((0, shamir.CHUNKS), np.int64),
}

#: server_shards=1: the attacks patch the coordinator's server steps (route_shares, finish), which
#: a sharded server does not run
SECURE_SUM = dict(
    users=100, dim=4, cohorts=3, seed=7, backend="local", out_dir=None, server_shards=1
)


def _secure_sum_attack(monkeypatch, threat_model, mutant=None, quorum=None, attack=None):
    plan = importlib.import_module("rayfed.protocols.secure_sum.plan")
    monkeypatch.setattr(plan, "per_user", _deal_victim_alone(per_user))
    attack = attack or Isolation()
    attack.threshold_override, attack.quorum = mutant, quorum
    attack.install(monkeypatch)
    graph = "harary" if threat_model == "semi-honest" else "auto"
    with contextlib.suppress(BelowThreshold, ProtocolViolation):
        rayfed.run("secure-sum", threat_model=threat_model, graph=graph, **SECURE_SUM)
    from rayfed.protocols.secure_sum.steps import synthetic_inputs

    ctx = StepContext(name="evaluation", role="driver", seed=SECURE_SUM["seed"])
    truth = synthetic_inputs(ctx, 0, np.array([0]), SECURE_SUM["dim"], 1.0)[0]
    return attack, truth


def test_the_isolation_attack_recovers_a_users_input_under_semi_honest_parameters(monkeypatch):
    """The test can see the attack: at n = 100 on the sparse graph (k = 28, t = 6), the victim's
    other k - t neighbours give t self-mask shares and S's neighbours their keys: the victim's
    input comes back to the fixed-point step."""
    attack, truth = _secure_sum_attack(monkeypatch, "semi-honest")
    assert attack.self_shares >= attack.needed == 6
    np.testing.assert_allclose(attack.recovered, truth, atol=2 * 2.0**-16)


def test_the_isolation_attack_is_refused_by_the_clients_quorum_under_malicious(monkeypatch):
    """threat_model=malicious: declaring t = 36 honest users dropped leaves U3 = 64 below the
    quorum n - ⌈δn⌉ = 70, and the clients refuse to sign it (their own check: the server skips
    its own), so no share is revealed."""
    attack, truth = _secure_sum_attack(monkeypatch, "malicious")
    assert attack.s is not None and attack.signatures == 0 and attack.self_shares == 0
    assert attack.recovered is None


def test_the_isolation_attack_recovers_nothing_under_malicious(monkeypatch):
    """threat_model=malicious (k = 66, t = 36), the clients' quorum check off (the threshold
    alone): the signing round passes (the attack keeps one U3 for everyone) but the victim's
    other neighbours are k - t = 30 < t: its self-mask stays hidden and the server's best
    interpolation is not even a 256-bit seed."""
    attack, truth = _secure_sum_attack(monkeypatch, "malicious", quorum=1)
    assert attack.signatures >= (100 + 5) // 2 + 1  # every client check passed
    # at most the k - t neighbours outside S answer (fewer: one left with < t neighbours in U3 is
    # silent)
    assert attack.self_shares <= 66 - 36 < attack.needed == 36
    assert attack.recovered is None or not np.allclose(attack.recovered, truth, atol=0.5)


@pytest.mark.parametrize(
    "corrupt,threshold,quorum,outcome",
    [
        (5, None, 1, "nothing"),  # t = 36 > (66 + 5)/2, the quorum check off: the threshold alone
        (5, None, None, "refused"),  # and with it: U3 = 100 - 31 = 69 < 70
        (6, None, None, "recovered"),  # c = 6 = 2t - k: U3 = 70, every check passes
        (5, 35, None, "recovered"),  # t = 35 <= (66 + 5)/2 (the mutant): U3 = 70
    ],
)
def test_the_isolation_attack_with_corrupt_neighbours_is_tight_at_2t_minus_k(
    monkeypatch, corrupt, threshold, quorum, outcome
):
    """The stronger attack (the "+ c" of t > (k + c)/2, end to end): the server puts the victim's
    c corrupt neighbours in S and keeps them in U3 (they give the victim's self-mask shares and
    their own mask keys), so only t - c honest users are declared dropped and k - (t - c) holders
    answer. At n = 100 (k = 66, t = 36; all ⌈γn⌉ = 5 corrupt users next to the victim, the worst
    case) nothing comes back; with c = 6 = 2t - k, or t forced to 35, the input does."""
    p = find_params(100, dropout=0.3, corrupt=0.05, threat_model="malicious")
    assert (p.degree, p.threshold) == (66, 36)
    mutant = None if threshold is None else (p.degree, threshold)
    attack, truth = _secure_sum_attack(
        monkeypatch, "malicious", mutant, quorum, Isolation(corrupt=corrupt)
    )
    t = threshold or p.threshold
    assert attack.s.size == t and attack.dropped.size == t - corrupt
    if outcome == "refused":
        assert attack.signatures == 0 and attack.recovered is None
        return
    assert attack.signatures >= (100 + 5) // 2 + 1  # every client check passed
    assert attack.self_shares == 66 - (t - corrupt)
    if outcome == "nothing":
        assert attack.self_shares < t
        assert attack.recovered is None or not np.allclose(attack.recovered, truth, atol=0.5)
    else:
        np.testing.assert_allclose(attack.recovered, truth, atol=2 * 2.0**-16)


def test_the_consistency_round_alone_does_not_stop_the_isolation_attack(monkeypatch):
    """The mutant: malicious (consistency round, signed keys and lists) but k and t sized for a
    semi-honest server, as before issue 26 — the victim's input is recovered."""
    semi = find_params(100, dropout=0.3, corrupt=0.05, graph="harary")
    attack, truth = _secure_sum_attack(
        monkeypatch, "malicious", mutant=(semi.degree, semi.threshold)
    )
    assert attack.signatures >= (100 + 5) // 2 + 1
    np.testing.assert_allclose(attack.recovered, truth, atol=2 * 2.0**-16)


# --- LFL federated-mf: the isolated user's Round-1 message ---------------------------------------
LFL = dict(
    users=100,
    items=12,
    density=0.05,  # δ = 1/|ratings| (and so z) as measured, before LFL's default became 0.1
    iterations=1,
    cohorts=3,
    seed=3,
    backend="local",
    out_dir=None,
    server_shards=1,
)


def _lfl_attack(monkeypatch, threat_model, mutant=None, quorum=None):
    driver = importlib.import_module("rayfed.protocols.federated_mf.lfl.driver")
    plan = importlib.import_module("rayfed.protocols.federated_mf.lfl.plan")
    monkeypatch.setattr(plan, "per_user", _deal_victim_alone(per_user))
    sent = {}
    inputs = driver.lfl_round1_inputs

    def recording(ctx, round, ids, *args):
        out = inputs(ctx, round, ids, *args)
        if ctx.name == VICTIM_COHORT:
            sent["row"] = np.asarray(out[0])[0]
        return out

    monkeypatch.setattr(driver, "lfl_round1_inputs", recording)
    attack = Isolation(threshold_override=mutant, quorum=quorum)
    attack.install(monkeypatch)
    with contextlib.suppress(BelowThreshold, ProtocolViolation):
        rayfed.run("federated-mf", threat_model=threat_model, **LFL)
    return attack, sent["row"]


def test_lfl_round1_isolation_recovers_the_users_noisy_gradient_under_semi_honest(monkeypatch):
    """LFL's Round 1 under semi-honest parameters: the isolated user's G_i + ξ_i (its own noise
    share only, not the sum's) comes back to the fixed-point step."""
    attack, row = _lfl_attack(monkeypatch, "semi-honest")
    assert attack.s is not None and attack.self_shares >= attack.needed
    # what the server reads: one user's G_i + ξ_i, ξ_i ~ N(0, ζ1·σ²): noise multiplier z·√ζ1
    # (ζ1 = 2/((1−ω)n − c) = 2/65: 0.356 here, about 0.32 at 1500 users, density 0.05) where the
    # sum's is z (2.03; 7.06)
    from rayfed.api import resolve

    proto, run_opts, cfg = resolve("federated-mf", None, (), **LFL)
    share = proto.plan(cfg, run_opts.seed).params.releases.round1.mechanism
    assert share.noise_multiplier * math.sqrt(share.share) == pytest.approx(0.356, abs=1e-3)
    step = 2.0**-16 * 2
    np.testing.assert_allclose(attack.recovered, row, atol=step)


def test_lfl_round1_isolation_recovers_nothing_under_malicious(monkeypatch):
    """The threshold alone (the clients' quorum check off; with it, U3 falls below ⌈(1-ω)n⌉ and
    the clients refuse to sign)."""
    attack, row = _lfl_attack(monkeypatch, "malicious", quorum=1)
    assert attack.s is not None and attack.self_shares < attack.needed
    assert attack.recovered is None or not np.allclose(attack.recovered, row, atol=0.5)


def test_lfl_round1_isolation_under_a_semi_honest_threshold_with_the_consistency_round(monkeypatch):
    """The mutant in LFL: the consistency round with semi-honest k and t (issue 26's
    consistency=true) lets the server read one user's Round-1 message."""
    semi = find_params(100, dropout=0.3, corrupt=0.05)
    attack, row = _lfl_attack(monkeypatch, "malicious", mutant=(semi.degree, semi.threshold))
    assert attack.signatures > 0 and attack.self_shares >= attack.needed
    np.testing.assert_allclose(attack.recovered, row, atol=2 * 2.0**-16)


# --- options: refused combinations and the headline ----------------------------------------------
def test_the_headline_names_the_threat_model_k_t_and_both_bounds(tmp_path, capsys):
    """`rayfed run secure-sum --set threat_model=malicious` prints the model, k, t and both
    failure bounds (here at n = 200: k = 126, t = 69; no user can have 2t - k = 12 > 10 corrupt
    neighbours, so the security bound is 0)."""
    from rayfed.cli import main

    args = ["run", "secure-sum", "--backend", "local", "--out", str(tmp_path)]
    for option in ("users=200", "dim=2", "threat_model=malicious"):
        args += ["--set", option]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Harary graph k=126" in out and "t=69" in out
    assert "threat model malicious: P[security failure] <= 0, P[abort] <= 2^-31.1" in out


@pytest.mark.parametrize(
    "options,field",
    [
        ({"allow_weak_params": True}, "allow_weak_params"),
        ({"mode": "dealer"}, "threat_model"),
        ({"mode": "plain"}, "threat_model"),
        ({"threshold": 40}, "threshold"),  # k = 126 at n = 200: 2t <= k
        ({"threshold": 64, "degree": 126}, "threshold"),  # 2t > k, but the bound is missed
        ({"tolerated_dropout": 0.49}, "tolerated_dropout"),
    ],
)
def test_malicious_refuses_what_cannot_hold_before_any_actor(options, field):
    with pytest.raises(ConfigError) as err:
        rayfed.run(
            "secure-sum", backend="local", out_dir=None, users=200, dim=2,
            threat_model="malicious", **options,
        )  # fmt: skip
    assert err.value.field == field


# --- the clients' own quorum ---------------------------------------------------------------------
def _skip_quorum_and_drop_a_cohort(monkeypatch) -> dict:
    """The malicious server of the review: it skips its own quorum checks and declares the first
    cohort's users dropped after their masked inputs arrived, so that the sum it decodes covers
    fewer users than the quorum. Returns what it decoded (``survivors``) if it got that far."""
    decoded: dict = {}
    masked, finish = server.collect_masked, server.finish

    def no_quorum(st, phase, alive):
        st.counts[phase] = int(alive)

    def collect_masked(ctx, spec, replies):
        first = sorted(replies)[0]
        return masked(ctx, spec, {k: v for k, v in replies.items() if k != first})

    def finishing(ctx, spec, replies):
        out = finish(ctx, spec, replies)
        decoded.update(survivors=np.asarray(out["survivors"]), quorum=spec.min_survivors)
        return out

    monkeypatch.setattr(server, "_quorum", no_quorum)
    monkeypatch.setattr(server, "collect_masked", collect_masked)
    monkeypatch.setattr(server, "finish", finishing)
    return decoded


@pytest.mark.parametrize("threat_model", ["semi-honest", "malicious"])
def test_the_clients_refuse_a_survivors_list_below_the_quorum_in_secure_sum(
    monkeypatch, threat_model
):
    """A server that skips its quorum and drops a cohort of 33 decodes the sum of 67 < 70 users
    under semi-honest (out of its scope: that server follows the protocol); under malicious the
    clients refuse to sign the list, and nothing is decoded."""
    decoded = _skip_quorum_and_drop_a_cohort(monkeypatch)
    options = dict(SECURE_SUM, mode="simulation", threat_model=threat_model)
    if threat_model == "semi-honest":
        rayfed.run("secure-sum", **options)
        assert decoded["survivors"].size == 67 < decoded["quorum"] == 70
        return
    with pytest.raises(ProtocolViolation, match="holds 67 users, fewer than the quorum of 70"):
        rayfed.run("secure-sum", **options)
    assert not decoded


def test_the_clients_refuse_a_survivors_list_below_the_quorum_with_a_sharded_server(monkeypatch):
    """The same malicious coordinator in front of two server shards (it still collects the masked
    inputs and signatures; the shards only route and reconstruct): the clients refuse to sign the
    67 users it declares, so no shard is asked to unmask anything and nothing is decoded."""
    decoded = _skip_quorum_and_drop_a_cohort(monkeypatch)
    routed, unmasked = [], []
    route, split = server.shard_route, client.unmask_split
    monkeypatch.setattr(server, "shard_route", lambda *a: routed.append(1) or route(*a))
    monkeypatch.setattr(client, "unmask_split", lambda *a: unmasked.append(1) or split(*a))
    options = dict(SECURE_SUM, mode="simulation", threat_model="malicious", server_shards=2)
    with pytest.raises(ProtocolViolation, match="holds 67 users, fewer than the quorum of 70"):
        rayfed.run("secure-sum", **options)
    assert len(routed) == 2  # the round ran on the two shards
    assert not decoded and not unmasked


def test_the_clients_refuse_a_round1_sum_below_lfl_threshold(monkeypatch):
    """LFL charges its Round 1 for |U1| >= t = ⌈(1-ω)n⌉ (70 of 100): the spec's quorum is t, so
    the clients refuse to sign a U1 of 67 that a malicious server declares, skipping its quorum
    and the driver's own |U1| < t skip (both on the server's side); without the clients' check
    the server decoded the sum of 67 noisy gradients whose σ falls short of what was charged."""
    decoded = _skip_quorum_and_drop_a_cohort(monkeypatch)
    from rayfed.api import resolve

    proto, run_opts, cfg = resolve("federated-mf", None, (), threat_model="malicious", **LFL)
    assert proto.plan(cfg, run_opts.seed).params.threshold == 70
    with pytest.raises(ProtocolViolation, match="holds 67 users, fewer than the quorum of 70"):
        rayfed.run("federated-mf", threat_model="malicious", **LFL)
    assert not decoded


# --- make_spec: the model is the parameters' -----------------------------------------------------
def test_make_spec_takes_the_threat_model_from_the_parameters():
    """A round claims the model its t was sized for, both ways: malicious parameters give the
    consistency round and the PKI (they used to give a semi-honest round reported as malicious
    by its parameters), semi-honest ones never do, and there is no second argument to disagree."""
    from rayfed.secagg import FixedPoint, make_spec

    def spec(model, mode="simulation", **kw):
        params = find_params(100, dropout=0.3, corrupt=0.05, threat_model=model)
        return make_spec(
            round=0, mode=mode, registry=np.arange(100), params=params,
            encoding=FixedPoint.choose(100, 1.0, 8), dim=2, **kw,
        )  # fmt: skip

    malicious = spec("malicious")
    assert malicious.threat_model == "malicious" and malicious.consistency
    assert (malicious.degree, malicious.threshold) == (66, 36)
    semi = spec("semi-honest")
    assert semi.threat_model == "semi-honest" and not semi.consistency
    with pytest.raises(TypeError, match="threat_model"):
        spec("semi-honest", threat_model="malicious")
    with pytest.raises(ConfigError, match="the users' own keys") as err:
        spec("malicious", mode="dealer")
    assert err.value.field == "threat_model"


def test_the_headlines_print_k_on_the_complete_graph_the_survivor_choice_and_the_mode():
    """The complete graph's k = n - 1 is printed (secure-sum's headline, LFL's note); the
    malicious statement says the server chooses the survivors above the quorum; LFL's headline
    says when its Round 1 is not secure, as secure-sum's does."""
    from rayfed.protocols.secure_sum.report import MALICIOUS_STATEMENT

    assert "chooses which users count as survivors" in MALICIOUS_STATEMENT
    assert "but an abort" not in MALICIOUS_STATEMENT
    ss = rayfed.run("secure-sum", backend="local", out_dir=None, users=20, dim=2, graph="complete")
    assert "complete graph k=19 (SecAgg, k = n - 1), Shamir threshold t=" in ss.headline
    lfl = rayfed.run("federated-mf", **dict(LFL, users=11), threat_model="malicious")
    assert lfl.metrics["secagg_degree"] == 10  # n = 11 under malicious: the complete graph
    assert "threat model malicious [simulation mode, NOT secure]" in lfl.headline
    assert any("complete graph k=10 (n - 1), t=6" in note for note in lfl.privacy.notes)
