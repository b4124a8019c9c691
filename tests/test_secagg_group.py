"""The one secure sum over any group (issue 26): ``secure_sum`` over the parties — one SecAgg user
per party, its index in the party order — with a party that dies after sharing its keys
recovered (its pairwise masks rebuilt from the others' key shares), on both backends; and
hfl-kmeans's pairwise masking, which runs on it. References are the inputs summed in exact
integers, never the result."""

from __future__ import annotations

import re
import sys

import numpy as np
import pyarrow as pa
import pytest

import rayfed
from rayfed.errors import ConfigError, PartyFailed
from rayfed.faults import Fault
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.secagg import (
    FixedPoint,
    ProtocolViolation,
    RingWords,
    find_params,
    make_spec,
    secure_sum,
)
from rayfed.secagg.group import party_ids

NAMES = ["alice", "bob", "carol", "dave", "erin"]
DIM, FRAC = 4, 16


def _inputs(m: int) -> np.ndarray:
    """Party i's vector: values on the 2^-16 grid, so every sum of them is an exact float."""
    gen = np.random.default_rng(26)
    return gen.integers(-(2**16), 2**16, (m, DIM)) / 2.0**FRAC


def party_input(ctx, round, ids, x):
    """A party's input: its one user's row (ids = [its index in the party order])."""
    return x[ids]


def _party_sum(names, *, backend="local", fail=None, mode="simulation", dropout=0.0, x=None):
    m = len(names)
    x = _inputs(m) if x is None else x
    params = find_params(m, dropout=dropout, graph="complete")
    spec = make_spec(
        round=1,
        mode=mode,
        registry=np.arange(m),
        params=params,
        encoding=FixedPoint.choose(m, 1.0, FRAC),
        dim=DIM,
    )
    parties = {name: (pa.table({"row": [i]}), {}) for i, name in enumerate(names)}
    faults = [Fault("parties", fail, phase="masked_input")] if fail else []
    with Federation(
        run_id="group",
        seed=5,
        parties=parties,
        privacy=PrivacyDeclaration.none("test"),
        backend=backend,
        randomness="secure" if mode == "secure" else "seeded",
        faults=faults,
    ) as fed:
        result = secure_sum(
            fed.parties, spec, party_input, (x,), server=fed.coordinator, ids=party_ids(names)
        )
    return result, x, spec


@pytest.mark.parametrize("mode", ["simulation", "secure"])
def test_a_sum_over_parties_without_dropout_equals_the_plain_sum(mode):
    result, x, spec = _party_sum(NAMES[:4], mode=mode)
    exact = np.rint(x * 2**FRAC).astype(np.int64).sum(axis=0)
    assert np.array_equal(spec.encoding.signed(result.words), exact)
    assert np.array_equal(result.sum, x.sum(axis=0))  # exact: every input is on the grid
    assert result.survivors.tolist() == [0, 1, 2, 3] and not result.failed_cohorts


def _check_dropped(result, x, dead: int) -> None:
    survivors = [i for i in range(len(x)) if i != dead]
    assert result.failed_cohorts == [NAMES[dead]]
    assert result.survivors.tolist() == survivors
    assert result.dropped_after_sharing.tolist() == [dead]  # its masks had to be recovered
    assert np.array_equal(result.sum, x[survivors].sum(axis=0))
    assert not np.array_equal(result.sum, x.sum(axis=0))  # the dead party's input is absent


@pytest.mark.parametrize("mode", ["simulation", "secure"])
def test_a_party_killed_after_sharing_its_keys_leaves_the_exact_sum_of_the_others(mode):
    """5 parties (t = 3 of the 4 others, one dropout tolerated); carol dies at masked_input, after
    share_keys: the others' pairwise masks with her are rebuilt from her key shares."""
    result, x, _ = _party_sum(NAMES, fail="carol", mode=mode, dropout=0.2)
    _check_dropped(result, x, NAMES.index("carol"))


def test_a_party_killed_on_ray_leaves_the_exact_sum_of_the_others(ray_cluster):
    """The same on Ray: bob's actor really dies (its process exits) after share_keys."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # party_input, for the workers
    result, x, _ = _party_sum(NAMES, backend="ray", fail="bob", dropout=0.2)
    _check_dropped(result, x, NAMES.index("bob"))


def test_a_party_with_another_partys_id_is_refused():
    """The ids the driver gives must be the registry's: a party cannot sum as a user that is not
    registered."""
    ids = {name: i + 5 for i, name in enumerate(NAMES[:3])}
    with pytest.raises(ProtocolViolation, match="not in the round's registry"):
        _sum_of(_inputs(3), FixedPoint.choose(3, 1.0, FRAC), ids=ids)


def test_ring_words_are_summed_exactly():
    """RingWords (a protocol's own ring words, hfl-kmeans's padded uploads) are summed mod 2^b as
    they are, neither clipped nor scaled: uniform 32-bit words come back exactly."""
    m, bits = 4, 32
    words = np.random.default_rng(7).integers(0, 2**bits, (m, DIM), dtype=np.uint64)
    words = words.astype(np.uint32)
    result = _sum_of(words, FixedPoint(float(2 ** (bits - 1)), 0, bits), word_input)
    expected = words.astype(np.uint64).sum(axis=0) % 2**bits
    assert np.array_equal(result.words.astype(np.uint64), expected)


def word_input(ctx, round, ids, words):
    """A party's row as words of the ring (the opt-in)."""
    return RingWords(words[ids])


def _sum_of(inputs: np.ndarray, encoding: FixedPoint, input_fn=party_input, ids=None):
    """secure_sum over len(inputs) parties, party i returning inputs[i] (one row); ``ids``: the
    parties' SecAgg ids (default: their index, ``party_ids``)."""
    m = len(inputs)
    spec = make_spec(
        round=1,
        mode="simulation",
        registry=np.arange(m),
        params=find_params(m, dropout=0.0, graph="complete"),
        encoding=encoding,
        dim=DIM,
    )
    parties = {name: (pa.table({"row": [i]}), {}) for i, name in enumerate(NAMES[:m])}
    with Federation(
        run_id="group",
        seed=5,
        parties=parties,
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
    ) as fed:
        return secure_sum(
            fed.parties,
            spec,
            input_fn,
            (inputs,),
            server=fed.coordinator,
            ids=party_ids(NAMES[:m]) if ids is None else ids,
        )


def test_integer_values_are_fixed_point_encoded_not_taken_as_words():
    """F3: a protocol whose input function returns plain integers (int64 counts) gets their sum,
    fixed-point encoded as every float is: ring words are opt-in (RingWords). Before, any integer
    dtype was taken as words, and 3 + 4 + 5 + 6 came back as 18 / 2^16 = 0.00027."""
    x = np.repeat(np.array([[3], [4], [5], [6]], dtype=np.int64), DIM, axis=1)
    result = _sum_of(x, FixedPoint.choose(4, 8.0, FRAC))
    assert np.array_equal(result.sum, np.full(DIM, 18.0))


def test_ring_words_outside_the_ring_are_refused():
    """RingWords must be words of Z_2^b: a word >= 2^b (or negative) is an error naming it, not
    silently reduced."""
    bits = 32
    words = np.zeros((3, DIM), dtype=np.int64)
    words[1, 2] = 2**bits
    with pytest.raises(PartyFailed, match=r"RingWords.*\[0, 2\^32\)"):
        _sum_of(words, FixedPoint(float(2 ** (bits - 1)), 0, bits), word_input)
    words[1, 2] = -1
    with pytest.raises(PartyFailed, match=r"RingWords.*\[0, 2\^32\)"):
        _sum_of(words, FixedPoint(float(2 ** (bits - 1)), 0, bits), word_input)


# --- hfl-kmeans's pairwise masking on the one secure sum --------------------------------------
HFL = dict(users=600, k=3, backend="local", out_dir=None, seed=1)


@pytest.mark.parametrize("topology", ["server", "ring"])
def test_hfl_pairwise_masking_runs_on_the_secure_sum_and_changes_nothing(topology):
    """masking=pairwise sends every client's upload through the secure sum over the parties (a
    masked_input per client and iteration); the masks cancel exactly, so the centroids are those
    of masking=shared-seed (the server) or of the first client's ring pad."""
    options = dict(HFL, clients=5, topology=topology, noise="none")
    shared = rayfed.run("hfl-kmeans", **options)
    pairwise = rayfed.run("hfl-kmeans", masking="pairwise", **options)
    assert shared.tables["centroids"].equals(pairwise.tables["centroids"])
    masked = [r for r in pairwise.transcript.to_pylist() if r["name"] == "masked_input"]
    assert len(masked) == 5 * pairwise.metrics["t_max"]
    assert {r["receiver"] for r in masked} == {"coordinator"}


def test_hfl_a_client_lost_in_the_secure_sum_ends_the_run_naming_it():
    """The sum survives a client that dies after sharing its keys, hfl-kmeans does not (its pads
    and its next iteration need every client: the thesis aborts): PartyFailed names it."""
    with pytest.raises(PartyFailed, match="p3"):
        rayfed.run(
            "hfl-kmeans", masking="pairwise", clients=5, fail=["party=p3@phase=masked_input"], **HFL
        )


# --- the worked example of docs/adding-a-protocol.md -------------------------------------------
def _docs_example():
    """The page's party_sum.py block, executed as a module."""
    import types
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "adding-a-protocol.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "party_sum.py" in b]
    module = types.ModuleType("party_sum_example")
    exec(compile(block, "docs/adding-a-protocol.md", "exec"), module.__dict__)
    return module


def test_the_docs_party_sum_survives_carol_in_process():
    result = _docs_example().main("local")
    assert result.survivors.tolist() == [0, 1, 3, 4]


def test_hfl_split_noise_drop_stops_before_the_coordinator_unmasks(monkeypatch):
    """F1: a client lost after sharing ends hfl-kmeans before the coordinator reconstructs any sum:
    on the ring with split noise the survivors' sum carries only their noise shares, which no
    ledger event charged. The server's ``finish`` (the unmask) must never run in that round."""
    from rayfed.secagg import server as server_steps

    finished = []
    real = server_steps.finish

    def spy(ctx, spec, answers):
        finished.append(spec.round)
        return real(ctx, spec, answers)

    monkeypatch.setattr(server_steps, "finish", spy)
    with pytest.raises(PartyFailed, match="p3"):
        rayfed.run(
            "hfl-kmeans",
            masking="pairwise",
            topology="ring",
            ring_noise="split",
            clients=5,
            fail=["party=p3@phase=masked_input"],
            **HFL,
        )
    assert 1 not in finished, "the coordinator unmasked the survivors' sum of round 1"


@pytest.mark.parametrize(
    ("m", "h"), [(3, 2), (5, 3), (5, 2), (8, 2), (10, 2), (10, 6), (5, 1), (2, 1)]
)
def test_hfl_sum_threshold_exceeds_the_coalition_the_statement_covers(m, h):
    """F1: the coordinator plus t clients hold t Shamir shares of every other client's secrets
    and can unmask one upload. Split noise is DP against any M - h clients: with h >= 2 an upload
    carries only a 1/h noise share, so t >= M - h + 1; on the server and elsewhere the statement
    is a server with fewer than t clients (t >= 2 from M = 3). Any drop aborts: quorum M."""
    from rayfed.protocols.hfl_kmeans.driver import sum_params

    p = sum_params(m, honest=h)
    assert p.min_survivors == m
    assert p.threshold <= m - 1
    if h >= 2:
        assert m - h < p.threshold  # the coalition holds fewer than t shares
    if m >= 3:
        assert p.threshold >= max(2, m // 2 + 1)
    plain = sum_params(m)
    assert plain.min_survivors == m and plain.threshold == min(m - 1, max(2, m // 2 + 1))


@pytest.mark.parametrize(
    "options",
    [
        dict(clients=5, topology="server"),
        dict(clients=5, topology="ring", noise="none"),
        dict(clients=6, topology="ring", ring_noise="split", honest_clients=2),
        dict(clients=5, topology="ring", ring_noise="split"),
    ],
    ids=["server", "ring-exact", "ring-split-h2", "ring-split-majority"],
)
def test_hfl_pairwise_note_states_what_the_secure_sum_gives_the_coordinator(options):
    """F2: the privacy note of masking=pairwise says what runs — the one secure sum over M clients,
    no partial sums (no X25519 ring), the threshold t the driver uses, the coordinator learning
    the released sum (the exact aggregate with noise=none) and one upload with t clients, against
    a semi-honest server — with M, t and M − h from the parameters, not a fixed string."""
    from rayfed.protocols.hfl_kmeans.params import sum_params

    result = rayfed.run("hfl-kmeans", masking="pairwise", **{**HFL, **options})
    m = options["clients"]
    h = options.get("honest_clients", min(m // 2 + 1, m - 1) if "ring_noise" in options else None)
    t = sum_params(m, honest=h).threshold
    (note,) = [n for n in result.privacy.notes if n.startswith("masking=pairwise")]
    assert f"M = {m} clients" in note and f"t = {t}" in note
    assert f"with t = {t} clients" in note and "semi-honest server" in note
    assert "partial sum" in note and "no partial sums" in note  # only to deny them
    assert "X25519" not in note
    if options["topology"] == "ring":
        exact = options.get("noise") == "none"
        assert ("the exact aggregate" in note) == exact
        assert ("the released noisy sum" in note) == (not exact)
    if h is not None:
        assert f"a 1/{h} share" in note and f"t > M − h = {m - h}" in note
        assert t > m - h


def _isolates(t: int, holders: int, corrupt: int) -> bool:
    """Brute force, independent of secagg.params: the server asks ``a`` of the victim's honest
    holders for its self-mask share and the rest for its key share; the corrupt holders give
    both. The upload is isolated when some split gathers t shares of each kind."""
    honest = holders - corrupt
    return any(corrupt + a >= t and corrupt + honest - a >= t for a in range(honest + 1))


@pytest.mark.parametrize("m", range(3, 13))
def test_hfl_malicious_threshold_defeats_the_isolation_up_to_m_minus_2_clients(m):
    """threat_model=malicious: t = M - 1 holds against a server that splits a victim's M - 1
    share holders (the complete graph) with up to M - 2 corrupt clients, and that bound is tight;
    the semi-honest t does not hold (the mutant: malicious sized like semi-honest)."""
    from rayfed.protocols.hfl_kmeans.params import malicious_coalition, sum_params

    p = sum_params(m, threat_model="malicious")
    c = malicious_coalition(m)
    assert (p.threshold, p.min_survivors, p.threat_model) == (m - 1, m, "malicious")
    assert not _isolates(p.threshold, m - 1, c)
    assert _isolates(p.threshold, m - 1, c + 1)  # tight: one more corrupt client isolates
    # the semi-honest t (< M - 1 from M = 5) falls to a malicious server with the same coalition
    if m >= 5:
        assert _isolates(sum_params(m).threshold, m - 1, c)


def test_hfl_malicious_runs_the_consistency_round_and_changes_no_result():
    """threat_model=malicious adds the signing round to every iteration's secure sum and names
    the coalition in the note; the centroids are the semi-honest run's, bit for bit."""
    options = dict(HFL, clients=4, topology="server", masking="pairwise", epsilon=2.0)
    honest = rayfed.run("hfl-kmeans", **options)
    malicious = rayfed.run("hfl-kmeans", threat_model="malicious", **options)
    assert honest.tables["centroids"].equals(malicious.tables["centroids"])
    signed = [r for r in malicious.transcript.to_pylist() if r["phase"] == "consistency"]
    assert len(signed) == 4 * malicious.metrics["t_max"]
    assert not [r for r in honest.transcript.to_pylist() if r["phase"] == "consistency"]
    (note,) = [n for n in malicious.privacy.notes if n.startswith("masking=pairwise")]
    assert "malicious server" in note and "t = 3 holds against up to c = 2" in note


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (dict(clients=2, masking="pairwise", threat_model="malicious"), "threat_model"),
        (dict(clients=4, masking="shared-seed", threat_model="malicious"), "threat_model"),
    ],
)
def test_hfl_malicious_refuses_what_cannot_hold(options, field):
    with pytest.raises(ConfigError) as err:
        rayfed.run("hfl-kmeans", **{**HFL, **options})
    assert err.value.field == field
