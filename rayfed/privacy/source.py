"""Where an actor's secrets come from: DP noise, secret keys and masks.

A run has one ``randomness``, and every actor holds a :class:`NoiseSource` built from it:

* ``seeded`` — every stream is derived from the run's root seed, keyed by (purpose, round, id):
  reproducible, and anyone who holds the seed (recorded in ``manifest.json``; the coordinator
  included) can regenerate every draw. The guarantee holds only while the seed is secret from
  every party.
* ``secure`` — each actor draws a 256-bit secret from the OS when it starts; its Generators are
  seeded from it (as a seeded run's are from the root seed) and its per-user draws are AES-256 in
  counter form under keys derived from it; secret keys, masks and seeds are read from
  ``os.urandom`` where they are used. The secret stays in the actor's process (on Ray, a process of
  its own; in-process, the driver's), so knowing the run seed gives nothing, and two runs draw
  different noise.

The Generators are numpy's PCG64, a statistical generator: its raw draws are never released,
only data plus noise — the usual assumption of DP libraries that do not claim a side-channel-free
sampler.

A source also keeps the events of the current step: every :mod:`rayfed.privacy` mechanism
registers the event it drew under, and a message may carry only events built from those
(:meth:`check_carried`) — so a charge is always tied to noise that was actually drawn.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections import Counter
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from dp_accounting import dp_event
from scipy.special import ndtri

from rayfed import rng
from rayfed.errors import ConfigError, UnaccountedNoise

#: words per chunk of keyed draws (see NoiseSource._keyed_floats)
_CHUNK_WORDS = 1 << 16

RANDOMNESS = ("seeded", "secure")

STATEMENTS = {
    "seeded": "seeded randomness: every noise draw and secret key is derived from the run's root "
    "seed (in manifest.json), so the guarantee holds only while that seed is secret from every "
    "party, the coordinator included; reproducible",
    "secure": "secure randomness: every noise draw and secret key comes from the OS inside the "
    "actor that uses it; knowing the run seed gives nothing; not reproducible",
}


def _feed(digest, release: Any) -> bool:
    """Hash every array (and number) in a release; False if it holds none (nothing was drawn)."""
    if isinstance(release, dict):
        return any([_feed(digest, release[k]) for k in sorted(release)])
    if isinstance(release, (list, tuple)):
        return any([_feed(digest, r) for r in release])
    values = np.asarray(release)
    if values.size == 0 or values.dtype == object:
        return False
    digest.update(np.ascontiguousarray(values).tobytes())
    return True


def leaves(event: dp_event.DpEvent) -> list[dp_event.DpEvent]:
    """The mechanism events a composed event is built from (compositions and sampling unwrapped;
    rayfed's own wrapping events name what was drawn through their ``drawn_events()``)."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return leaves(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return [leaf for sub in event.events for leaf in leaves(sub)]
    if isinstance(
        event, (dp_event.PoissonSampledDpEvent, dp_event.SampledWithoutReplacementDpEvent)
    ):
        return leaves(event.event)
    drawn = getattr(event, "drawn_events", None)
    if callable(drawn):
        return [leaf for sub in drawn() for leaf in leaves(sub)]
    return [event]


class NoiseSource:
    """One actor's source of DP noise and secrets, chosen by the run's ``randomness``.

    Parameters
    ----------
    randomness:
        ``"seeded"`` or ``"secure"`` (see the module docstring).
    seed:
        The run's root seed (used only when seeded).
    name:
        The actor's name: the default identity of its streams.
    """

    def __init__(self, randomness: str, seed: int, name: str):
        if randomness not in RANDOMNESS:
            raise ConfigError("randomness", f"unknown randomness {randomness!r}", RANDOMNESS)
        self.randomness = randomness
        self.name = name
        self._secret = secrets.token_bytes(32) if randomness == "secure" else b""
        self._root = int(seed) if randomness == "seeded" else int.from_bytes(self._secret, "big")
        self._draws: Counter = Counter()
        self.events: list[dp_event.DpEvent] = []
        self._elsewhere: list[bool] = []  # per event: part of a release another message carries
        #: a short digest of every mechanism's release and every secret drawn, in draw order: two
        #: runs drew the same noise and keys iff these agree (in memory only, never written out)
        self.fingerprints: list[str] = []

    @staticmethod
    def seeded(seed: int, name: str = "local") -> NoiseSource:
        """A seeded source outside any actor (tests, benchmarks, a driver-side baseline)."""
        return NoiseSource("seeded", seed, name)

    @property
    def secure(self) -> bool:
        return self.randomness == "secure"

    def __repr__(self) -> str:  # never print the secret
        return f"NoiseSource({self.randomness!r}, name={self.name!r})"

    def __getstate__(self) -> dict[str, Any]:
        if self.secure:
            raise TypeError("a secure NoiseSource never leaves its actor")
        return dict(self.__dict__)

    # --- draws ---------------------------------------------------------------------------------
    def generator(self, purpose: str, round: int = 0, ident: Any = None) -> np.random.Generator:
        """A fresh Generator for (purpose, round, ident — default this actor's name).

        Each call with the same key advances a draw counter, so two mechanisms in one actor never
        reuse noise; the order of calls in an actor is the driver's, hence reproducible.
        """
        who = self.name if ident is None else ident
        key = (purpose, int(round), repr(who))
        draw = self._draws[key]
        self._draws[key] += 1
        return rng.stream(self._root, purpose, round, (who, draw))

    def _keyed_words(self, purpose: str, round: int, ids: np.ndarray, n: int) -> np.ndarray:
        """``(len(ids), n)`` uint64 words keyed by (purpose, round, user id, index): the seeded
        run's vectorised Philox, or AES-256 over (id, index) blocks under a key derived from the
        actor's secret (a PRF with a 256-bit key) in a secure run."""
        ids = np.asarray(ids, dtype=np.uint64)
        if not self.secure:
            return rng.keyed_bits64(self._root, purpose, round, ids, n)
        label = f"{purpose}|{int(round)}".encode()
        key = hashlib.blake2b(label, key=self._secret, digest_size=32).digest()
        blocks = -(-n // 2)
        counters = np.zeros((ids.size, blocks, 2), dtype=np.uint64)
        counters[:, :, 0] = ids[:, None]
        counters[:, :, 1] = np.arange(blocks, dtype=np.uint64)
        out = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(counters.tobytes())
        return np.frombuffer(out, dtype=np.uint64).reshape(ids.size, 2 * blocks)[:, :n]

    def user_uniform(self, purpose: str, round: int, ids: np.ndarray, n: int = 1) -> np.ndarray:
        """``(len(ids), n)`` uniforms in [0, 1) keyed by user id: in a seeded run a user's draws are
        the same whichever cohort hosts it. There is no draw counter here: two draws in one round
        must use two purposes (each mechanism has its own)."""

        def finish(u: np.ndarray, out: np.ndarray) -> None:
            np.multiply(u, 2.0**-53, out=out)

        return self._keyed_floats(purpose, round, ids, n, finish)

    def user_normal(self, purpose: str, round: int, ids: np.ndarray, n: int = 1) -> np.ndarray:
        """``(len(ids), n)`` standard normals keyed by user id (inverse CDF of open uniforms)."""

        def finish(u: np.ndarray, out: np.ndarray) -> None:
            u += 0.5
            u *= 2.0**-53
            ndtri(u, out=out)

        return self._keyed_floats(purpose, round, ids, n, finish)

    def _keyed_floats(self, purpose: str, round: int, ids: np.ndarray, n: int, finish):
        """``(len(ids), n)`` floats: ``finish(u, out)`` maps each chunk's 53-bit integers ``u``
        (as floats) into its rows of the output. Chunks of ids keep the temporaries in cache;
        a user's draws do not depend on the chunk (the golden runs hold bit for bit)."""
        ids = np.asarray(ids, dtype=np.uint64)
        out = np.empty((ids.size, max(n, 0)), dtype=np.float64)
        per_chunk = max(1, _CHUNK_WORDS // max(n, 1))
        for a in range(0, ids.size, per_chunk):
            words = self._keyed_words(purpose, round, ids[a : a + per_chunk], n)
            finish((words >> np.uint64(11)).astype(np.float64), out[a : a + per_chunk])
        return out

    def user_words(self, purpose: str, round: int, ids: np.ndarray, n: int) -> np.ndarray:
        """``(len(ids), n)`` uint64 secret words per user (key material): the OS when secure."""
        ids = np.asarray(ids, dtype=np.uint64)
        if self.secure:
            words = np.frombuffer(os.urandom(8 * n * ids.size), dtype=np.uint64)
            words = words.reshape(ids.size, n).copy()
        else:
            words = rng.keyed_bits64(self._root, purpose, round, ids, n)
        self._fingerprint(words)
        return words

    def user_bytes(self, purpose: str, round: int, ids: np.ndarray, n: int) -> np.ndarray:
        """``(len(ids), n)`` uint8 secret bytes per user (keys, seeds): the OS when secure."""
        width = -(-n // 8)
        words = self.user_words(purpose, round, ids, width)
        # reshape with an explicit width: a cohort whose users all dropped has no rows
        return (
            np.ascontiguousarray(words).view(np.uint8).reshape(len(words), 8 * width)[:, :n].copy()
        )

    def secret_bytes(self, purpose: str, n: int, round: int = 0, ident: Any = None) -> bytes:
        """``n`` secret bytes of this actor (a key, a mask seed): the OS when secure."""
        raw = os.urandom(n) if self.secure else self.generator(purpose, round, ident).bytes(n)
        self._fingerprint(np.frombuffer(raw, dtype=np.uint8))
        return raw

    # --- the step's events ---------------------------------------------------------------------
    def begin_step(self) -> None:
        self.events, self._elsewhere = [], []

    def register(
        self, event: dp_event.DpEvent, release: Any = None, *, part_of: str | None = None
    ) -> None:
        """Called by every mechanism with the event it drew under and its release; ``part_of``
        names the release, carried by another message, that this draw belongs to (LFL's Round 2
        replaces Round 1's shares)."""
        self.events.append(event)
        self._elsewhere.append(part_of is not None)
        self._fingerprint(release)

    def _fingerprint(self, drawn: Any) -> None:
        digest = hashlib.blake2b(digest_size=8)
        if _feed(digest, drawn):
            self.fingerprints.append(digest.hexdigest())

    def check_all_carried(self, carried: list[dp_event.DpEvent]) -> None:
        """UnaccountedNoise if a mechanism drew in this step and no message of the step carries
        its event (unless the draw is part of a release another message carries): noise that
        reaches a reply uncharged."""
        sent = [leaf for event in carried for leaf in leaves(event)]
        for event, elsewhere in zip(self.events, self._elsewhere, strict=True):
            if not elsewhere and event not in sent:
                raise UnaccountedNoise(
                    f"{self.name}: a mechanism drew {event} in this step but no message carries "
                    "it (send the mechanism's event with the noisy release)"
                )

    def check_carried(self, event: dp_event.DpEvent, what: str) -> None:
        """UnaccountedNoise unless every mechanism event ``event`` is built from was drawn by a
        mechanism in the current step."""
        for leaf in leaves(event):
            if leaf not in self.events:
                raise UnaccountedNoise(
                    f"{self.name}: {what} carries {leaf}, which no rayfed.privacy mechanism drew "
                    "in this step (noise must be drawn through a mechanism, whose event the "
                    "message then carries)"
                )
