"""What every role knows about one secure-aggregation round, and the randomness it draws."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from rayfed import rng
from rayfed.dropout import DropoutSchedule
from rayfed.errors import RayfedError
from rayfed.secagg import phases
from rayfed.secagg.encoding import FixedPoint
from rayfed.secagg.graph import NeighbourGraph

MODES = ("secure", "simulation", "dealer", "plain")


class ProtocolViolation(RayfedError):
    """A secure-aggregation message failed a check: a tampered ciphertext, a key table that does
    not hold the user's own keys, or a server request that would reveal both shares of a user."""


class UnauthenticatedKeys(ProtocolViolation):
    """Key-table rows whose signature does not verify under the users' PKI keys (``consistency``
    rounds): the server substituted their keys, or named users the PKI does not know."""

    def __init__(self, users, cohort: str = ""):
        self.users = [int(u) for u in users]
        self.cohort = cohort
        super().__init__(
            f"{cohort}: the key table's keys of user(s) {self.users} are not signed by their "
            "PKI keys (substituted by the server, or unknown to the PKI): round refused, no "
            "share sent"
        )

    def __reduce__(self):  # keep the fields when Ray pickles the error across processes
        return (type(self), (self.users, self.cohort))


@dataclass(frozen=True)
class RoundSpec:
    """Public parameters of one round, sent to the coordinator and every cohort.

    ``registry`` is the sorted array of the n registered user ids; a user's *position* in it
    (0..n-1) names it in the graph, and position + 1 is its Shamir x-coordinate.
    """

    round: int
    mode: str
    registry: np.ndarray
    degree: int
    threshold: int
    min_survivors: int
    complete: bool
    encoding: FixedPoint
    dim: int
    dropout: DropoutSchedule = field(default_factory=phases.schedule)  # in SecAgg's phases
    tag: bytes = b"rayfed"
    #: the server the round defends against: "malicious" runs SecAgg's consistency round (users
    #: sign U3 and reveal no share unless more than (n + c)/2 users signed the very list they
    #: signed themselves; users also sign their X25519 keys, checked against the simulated PKI,
    #: the driver, in share_keys), with t sized against the isolation attack (secagg.params)
    threat_model: str = "semi-honest"
    #: users the parameters assume corrupt (⌈γn⌉): they may sign two lists
    corrupt_users: int = 0
    #: the transcript's addresses: the server the users answer (``to=``), and who its broadcasts
    #: go to (a role, or the member names of a round over some of them, e.g. a hierarchy's group)
    server: str = "coordinator"
    clients: str | tuple[str, ...] = "cohorts"

    @property
    def consistency(self) -> bool:
        """Whether the round has the consistency round and the PKI (``malicious``)."""
        return self.threat_model == "malicious"

    @property
    def n(self) -> int:
        return int(self.registry.size)

    @property
    def word_dtype(self) -> np.dtype:
        return self.encoding.dtype

    @property
    def salt(self) -> bytes:
        return b"%s|round=%d" % (self.tag, self.round)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.registry, ids)
        if ids.size and (pos.max() >= self.n or not np.array_equal(self.registry[pos], ids)):
            raise ProtocolViolation("a cohort holds users that are not in the round's registry")
        return pos

    def signatures_needed(self) -> int:
        """Valid signatures a user needs on the survivors list before it unmasks: more than
        (n + c)/2 for the n registered users and c corrupt ones. Honest users sign one list
        each and the corrupt at most every list, so two different lists cannot both gather
        that many, whatever the server shows to whom (n, not the U1 the server reports, which
        it could shrink per user)."""
        return (self.n + self.corrupt_users) // 2 + 1

    def survivors_message(self, survivors: np.ndarray) -> bytes:
        """What a user signs in the consistency round: this round's salt and a digest of U3."""
        digest = hashlib.sha256(np.asarray(survivors, dtype="<i8").tobytes()).digest()
        return self.salt + b"|u3|" + digest

    def keys_message(self, user_id: int, c_pk: np.ndarray, s_pk: np.ndarray) -> bytes:
        """What a user signs at advertise (consistency rounds): this round's salt, its id and
        its two X25519 public keys, so a signed row cannot move to another user or round."""
        ident = int(user_id).to_bytes(8, "little", signed=True)
        keys = np.concatenate([np.asarray(c_pk, np.uint8), np.asarray(s_pk, np.uint8)])
        return self.salt + b"|keys|" + ident + keys.tobytes()

    def graph(self, seed: int) -> NeighbourGraph:
        return NeighbourGraph.build(self.n, self.degree, self.complete, seed, self.round)


def sign(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """+1 where u > v, -1 where u < v: user u adds sign(u, v)·PRG(s_uv), so p_uv + p_vu = 0."""
    return np.where(np.asarray(u) > np.asarray(v), 1, -1)


def check_source(spec: RoundSpec, noise) -> None:
    """The mode must match the actor's randomness: ``secure`` draws every key from the OS, so it
    needs a secure run; ``simulation`` and ``dealer`` derive keys from the run seed, so they are
    refused in one (a secure run's label must not hide seeded keys)."""
    if spec.mode == "secure" and not noise.secure:
        raise ProtocolViolation("mode=secure needs a run with randomness=secure (keys from the OS)")
    if spec.mode in ("simulation", "dealer") and noise.secure:
        raise ProtocolViolation(
            f"mode={spec.mode} derives keys from the run seed, which a secure run refuses: "
            "use mode=secure"
        )


def dealer_key(seed: int, round: int) -> bytes:
    """The dealer's AES key for a round (``dealer`` mode: a trusted party deals all mask seeds)."""
    return rng.stream(seed, "secagg-pairs", round, "dealer").bytes(32)


def pair_codes(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """A code per unordered pair of positions (the same for (a, b) and (b, a))."""
    lo, hi = np.minimum(a, b).astype(np.uint64), np.maximum(a, b).astype(np.uint64)
    return lo * np.uint64(n) + hi


def self_codes(pos: np.ndarray) -> np.ndarray:
    return np.asarray(pos, dtype=np.uint64) | np.uint64(1 << 62)


def mask_blocks(spec: RoundSpec) -> int:
    """AES blocks per mask vector of ``dim`` words."""
    return math.ceil(spec.dim * spec.word_dtype.itemsize / 16)
