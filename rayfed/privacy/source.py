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
registers the event it drew under, whole (with its multiplicity and its sampling), and the step's
messages must carry exactly those draws (:meth:`NoiseSource.check_carried`,
:meth:`NoiseSource.check_all_carried`) — so a charge is always tied to noise that was actually
drawn, as often and as sampled as the event says. A subsampled event is registered only after a
Poisson sample at its rate was drawn in the step (:meth:`NoiseSource.poisson_sample`).

Tests can install a noiseless probe (:func:`noiseless`): measurements then release their exact
query values through it instead of drawing noise — the empirical sensitivity check of the
conformance suite. The core refuses it outside a test run.
"""

from __future__ import annotations

import contextlib
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


#: the installed noiseless probe (tests only; see :func:`noiseless`)
_PROBE: Any = None


@contextlib.contextmanager
def noiseless(probe):
    """Within the block, every seeded source built gets ``probe``: a :class:`Measurement
    <rayfed.privacy.measurement.Measurement>` then releases ``probe.observe(...)`` (its exact
    query value) instead of a noisy one. Only inside a pytest test: a run without noise is never
    a product's run."""
    global _PROBE
    if not os.environ.get("PYTEST_CURRENT_TEST"):
        raise RuntimeError("the noiseless probe exists for tests only (pytest is not running)")
    _PROBE = probe
    try:
        yield probe
    finally:
        _PROBE = None


def sampled_rates(event: dp_event.DpEvent) -> list[float]:
    """The Poisson sampling rates ``event`` claims, one per sampled release it holds."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return sampled_rates(event.event) * event.count
    if isinstance(event, dp_event.ComposedDpEvent):
        return [r for sub in event.events for r in sampled_rates(sub)]
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return [float(event.sampling_probability), *sampled_rates(event.event)]
    rate = getattr(event, "sampling_probability", None)  # rayfed's group-sampled event
    return [float(rate)] if rate is not None else []


def _consume(event: dp_event.DpEvent, pool: list[dp_event.DpEvent]) -> bool:
    """Remove from ``pool`` the draws ``event`` is made of: the event itself if it was drawn
    whole, else its parts, each as often as it composes them. False if a part was not drawn."""
    if event in pool:
        pool.remove(event)
        return True
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return all(_consume(event.event, pool) for _ in range(event.count))
    if isinstance(event, dp_event.ComposedDpEvent):
        return all(_consume(sub, pool) for sub in event.events)
    drawn = getattr(event, "drawn_events", None)  # a wrapping event names what its step drew
    if callable(drawn):
        return all(_consume(sub, pool) for sub in drawn())
    return False


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
        self._samples: list[float] = []  # rates of the step's Poisson samples not yet used
        self._keyed: dict[tuple[str, int], np.ndarray] = {}  # users drawn per (purpose, round)
        #: the noiseless probe of a sensitivity test (None in every real run)
        self.probe = _PROBE if randomness == "seeded" else None
        if self.probe is not None and not os.environ.get("PYTEST_CURRENT_TEST"):
            raise RuntimeError("the noiseless probe exists for tests only (pytest is not running)")
        #: the declared releases this step drew shares of (``part_of``), for the federation to
        #: check that a message of the round carries each; the events of shared releases drawn
        self.parts: list = []
        self.shared: list = []
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

    def user_uniform(
        self, purpose: str, round: int, ids: np.ndarray, n: int = 1, *, again: bool = False
    ) -> np.ndarray:
        """``(len(ids), n)`` uniforms in [0, 1) keyed by user id: in a seeded run a user's draws are
        the same whichever cohort hosts it. There is no draw counter here, so a user's second
        draw of one (purpose, round) would repeat its first — two releases sharing one noise, whose
        difference is noise-free: refused unless ``again`` says the repeat is deliberate (a user
        regenerating its own share to cancel it)."""

        def finish(u: np.ndarray, out: np.ndarray) -> None:
            np.multiply(u, 2.0**-53, out=out)

        return self._keyed_floats(purpose, round, ids, n, finish, again)

    def user_normal(
        self, purpose: str, round: int, ids: np.ndarray, n: int = 1, *, again: bool = False
    ) -> np.ndarray:
        """``(len(ids), n)`` standard normals keyed by user id (inverse CDF of open uniforms);
        a repeat is refused as in :meth:`user_uniform`."""

        def finish(u: np.ndarray, out: np.ndarray) -> None:
            u += 0.5
            u *= 2.0**-53
            ndtri(u, out=out)

        return self._keyed_floats(purpose, round, ids, n, finish, again)

    def user_discrete_gaussian(
        self, purpose: str, round: int, ids: np.ndarray, n: int, sigma2, *, again: bool = False
    ) -> np.ndarray:
        """``(len(ids), n)`` int64 draws of the discrete Gaussian N_Z(0, σ²) keyed by user id
        (:func:`rayfed.privacy.integer.discrete_gaussian_coins`, exact for σ² <= 2^30): every
        coordinate of every user draws its own coins, a pure function of (purpose, round, user id,
        coordinate, coin index) — AES-256 under a key derived from the root seed (seeded) or the
        actor's secret (secure) — so a seeded run gives a user the same noise whichever cohort hosts it. A
        repeat is refused as in :meth:`user_uniform`."""
        from rayfed.privacy.integer import PositionCoins, discrete_gaussian_coins

        ids = np.asarray(ids, dtype=np.uint64)
        self._first_keyed_draw(purpose, round, ids, again)
        width = max(int(n), 0)
        coins = PositionCoins(self._position_block(purpose, round, ids, width), ids.size * width)
        draw = discrete_gaussian_coins(coins, ids.size * width, sigma2)
        return draw.reshape(ids.size, width)

    def _position_block(self, purpose: str, round: int, ids: np.ndarray, width: int):
        """``block(pos, count)``: one uint64 word for each position pos = row·width + coordinate
        (row a user of ``ids``) and its draw count — keyed by (purpose, round, user id,
        coordinate, count), never by the position's place in the batch."""
        # AES-256 as the PRF in both modes (faster here than numpy-vectorised Philox): under a key
        # derived from the actor's secret when secure, from the root seed when seeded
        secret = self._secret if self.secure else hashlib.sha256(str(self._root).encode()).digest()
        label = f"{purpose}|{int(round)}|coins".encode()
        key = hashlib.blake2b(label, key=secret, digest_size=32).digest()
        cipher = Cipher(algorithms.AES(key), modes.ECB())

        def block(pos: np.ndarray, count: np.ndarray) -> np.ndarray:
            counters = np.empty((pos.size, 2), dtype=np.uint64)
            counters[:, 0] = ids[pos // width]
            coord = (pos % width).astype(np.uint64)
            counters[:, 1] = (coord << np.uint64(32)) | count.astype(np.uint64)
            raw = cipher.encryptor().update(counters.tobytes())
            return np.frombuffer(raw, dtype=np.uint64).reshape(pos.size, 2)[:, 0].copy()

        return block

    def user_skellam(
        self, purpose: str, round: int, ids: np.ndarray, n: int, mu: float, *, again: bool = False
    ) -> np.ndarray:
        """``(len(ids), n)`` int64 draws of Poisson(μ) − Poisson(μ) keyed by user id: each user's
        Generator is seeded from four keyed words of (purpose, round, user id) (Philox in a seeded
        run, AES-256 under the actor's secret in a secure one). A repeat is refused as in
        :meth:`user_uniform`."""
        from rayfed.privacy.integer import skellam

        ids = np.asarray(ids, dtype=np.uint64)
        self._first_keyed_draw(purpose, round, ids, again)
        seeds = self._keyed_words(purpose, round, ids, 4)
        out = np.empty((ids.size, max(int(n), 0)), dtype=np.int64)
        for row, words in enumerate(seeds):
            gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words.tolist())))
            out[row] = skellam(gen, mu, out.shape[1])
        return out

    def _first_keyed_draw(self, purpose: str, round: int, ids: np.ndarray, again: bool) -> None:
        """Record the users drawn under (purpose, round); UnaccountedNoise if one was drawn
        before and ``again`` is not set."""
        key = (purpose, int(round))
        done = self._keyed.get(key)
        fresh = np.unique(ids)
        if done is not None and not again:
            reused = np.intersect1d(done, fresh, assume_unique=True)
            if reused.size:
                raise UnaccountedNoise(
                    f"{self.name}: user {int(reused[0])} draws keyed noise of purpose {purpose!r} "
                    f"twice in round {round}: two releases would share one noise (give each "
                    "release its own purpose)"
                )
        self._keyed[key] = fresh if done is None else np.union1d(done, fresh)

    def _keyed_floats(
        self, purpose: str, round: int, ids: np.ndarray, n: int, finish, again: bool = False
    ):
        """``(len(ids), n)`` floats: ``finish(u, out)`` maps each chunk's 53-bit integers ``u``
        (as floats) into its rows of the output. Chunks of ids keep the temporaries in cache;
        a user's draws do not depend on the chunk (the golden runs hold bit for bit)."""
        ids = np.asarray(ids, dtype=np.uint64)
        self._first_keyed_draw(purpose, round, ids, again)
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

    def poisson_sample(
        self,
        rate: float,
        size: int,
        *,
        round: int = 0,
        ident=None,
        purpose: str = "sample",
        ids: np.ndarray | None = None,
    ) -> np.ndarray:
        """A Poisson sample: a boolean mask over ``size`` units (or the users ``ids``, each keyed
        by its id, so a user's membership does not depend on its cohort), each in with
        probability ``rate``. It backs one subsampled event registered later in this step; an
        empty population backs nothing. Under the noiseless probe of a sensitivity test, the
        probe may widen it (``probe.sampled``: every unit in, so a release's sensitivity is
        measured with the changed unit in the sample)."""
        if (size if ids is None else len(ids)) < 1:
            raise UnaccountedNoise(f"{self.name}: a Poisson sample of no units backs no release")
        if ids is None:
            mask = self.generator(purpose, round, ident).random(size) < rate
        else:
            mask = self.user_uniform(purpose, round, ids)[:, 0] < rate
        if self.probe is not None and hasattr(self.probe, "sampled"):
            mask = self.probe.sampled(mask)
        self._samples.append(float(rate))
        return mask

    # --- the step's events ---------------------------------------------------------------------
    def begin_step(self) -> None:
        self.events, self._elsewhere, self._samples = [], [], []
        self.parts, self.shared = [], []

    def register(
        self, event: dp_event.DpEvent, release: Any = None, *, part_of=None, shared: bool = False
    ) -> None:
        """Called by every mechanism with the event it drew under and its release.

        ``part_of`` is the declared release (a :class:`~rayfed.privacy.measurement.Measurement`)
        this draw is a share of, when another message carries that release's event (LFL's
        Round 2 replaces Round 1's shares). ``shared``: the draw is one member's share of a
        release declared shared (one charge for the members' messages). Every sampling rate the
        event claims must be backed by a Poisson sample drawn in this step
        (:meth:`poisson_sample`), one sample per claim.
        """
        from rayfed.privacy.measurement import Measurement

        if part_of is not None and not isinstance(part_of, Measurement):
            raise TypeError(f"part_of names a declared release (a Measurement), got {part_of!r}")
        for rate in sampled_rates(event) if event is not None else []:
            if rate not in self._samples:
                raise UnaccountedNoise(
                    f"{self.name}: {event} claims Poisson sampling at rate {rate:g}, but no "
                    "sample at that rate was drawn in this step (draw it with poisson_sample)"
                )
            self._samples.remove(rate)
        self.events.append(event)
        self._elsewhere.append(part_of is not None)
        if part_of is not None:
            self.parts.append(part_of)
        if shared:
            self.shared.append(event)
        self._fingerprint(release)

    def _fingerprint(self, drawn: Any) -> None:
        digest = hashlib.blake2b(digest_size=8)
        if _feed(digest, drawn):
            self.fingerprints.append(digest.hexdigest())

    def check_all_carried(self, carried: list[dp_event.DpEvent]) -> None:
        """UnaccountedNoise unless the step's messages carry exactly the draws of this step:
        every draw (but shares of a release another message carries) in some carried event, as
        often as it was drawn, and every carried event made only of draws of this step — so a
        message cannot carry one charge for two draws, nor claim a draw it never made."""
        shares = [m.event for m in self.parts]
        if any(event in shares for event in carried):
            # a share belongs to a release *another* message carries: a step that carries the
            # release itself would release a second noisy copy under one charge
            raise UnaccountedNoise(
                f"{self.name}: a step carries a release and draws a share of it for elsewhere"
            )
        pool = [
            e for e, elsewhere in zip(self.events, self._elsewhere, strict=True) if not elsewhere
        ]
        for event in carried:
            if not _consume(event, pool):
                raise UnaccountedNoise(
                    f"{self.name}: a message carries {event}, but the step's draws do not make "
                    "it up (each release drawn once per time the event composes it)"
                )
        if pool:
            raise UnaccountedNoise(
                f"{self.name}: a mechanism drew {pool[0]} in this step but no message carries "
                "it (send the mechanism's event with the noisy release)"
            )

    def check_carried(self, event: dp_event.DpEvent, what: str) -> None:
        """UnaccountedNoise unless ``event`` is made of draws of the current step (each part as
        often as the event composes it)."""
        if not _consume(event, list(self.events)):
            raise UnaccountedNoise(
                f"{self.name}: {what} carries {event}, which the rayfed.privacy mechanisms of "
                "this step did not draw (noise must be drawn through a mechanism, whose event "
                "the message then carries, as often as the event composes it)"
            )
