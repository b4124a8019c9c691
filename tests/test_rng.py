import numpy as np
import pytest

from rayfed import rng

# Random123 known-answer vectors for Philox4x32-10 (kat_vectors): counter, key -> output.
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


@pytest.mark.parametrize("counter,key,expected", KAT, ids=["zeros", "ones", "pi"])
def test_philox_known_answers(counter, key, expected):
    out = rng.philox4x32(np.array(counter, dtype=np.uint32), tuple(key))
    assert out.tolist() == expected


def test_philox_vectorised_matches_one_at_a_time():
    counters = np.arange(40, dtype=np.uint32).reshape(10, 4)
    batch = rng.philox4x32(counters, (7, 9))
    for i in range(10):
        assert batch[i].tolist() == rng.philox4x32(counters[i], (7, 9)).tolist()


def test_keyed_uniform_depends_on_user_id_not_on_batch():
    ids = np.arange(1000, 1100)
    whole = rng.keyed_uniform(5, "test", 3, ids, 4)
    part = rng.keyed_uniform(5, "test", 3, ids[37:52], 4)
    assert np.array_equal(whole[37:52], part)
    shuffled = np.random.default_rng(0).permutation(ids)
    again = rng.keyed_uniform(5, "test", 3, shuffled, 4)
    assert np.array_equal(again[np.argsort(shuffled)], whole)


def test_keyed_uniform_streams_differ_by_purpose_round_and_seed():
    ids = np.arange(64)
    base = rng.keyed_uniform(5, "test", 0, ids, 2)
    for other in (
        rng.keyed_uniform(6, "test", 0, ids, 2),
        rng.keyed_uniform(5, "dropout", 0, ids, 2),
        rng.keyed_uniform(5, "test", 1, ids, 2),
    ):
        assert not np.array_equal(base, other)


def test_keyed_uniform_is_uniform():
    u = rng.keyed_uniform(1, "test", 0, np.arange(200_000), 2).ravel()
    n = u.size
    # mean of U(0,1): sd 1/sqrt(12 n); four standard deviations
    assert abs(u.mean() - 0.5) < 4 / np.sqrt(12 * n)
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    expected = n / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 50  # chi-square with 19 dof: P(> 50) ~ 1e-4


def test_stream_is_keyed_and_reproducible():
    a = rng.stream(3, "laplace", 2, "p1").random(5)
    assert np.array_equal(a, rng.stream(3, "laplace", 2, "p1").random(5))
    assert not np.array_equal(a, rng.stream(3, "laplace", 2, "p2").random(5))
    assert not np.array_equal(a, rng.stream(3, "gaussian", 2, "p1").random(5))
    with pytest.raises(ValueError, match="non-empty name"):
        rng.stream(3, "")


def test_a_named_purpose_needs_no_table_entry_and_never_collides_with_it():
    """A new protocol's purpose is keyed by its name alone: stable (a digest, not the salted
    hash()), distinct from other names, and above every code of the built-in table."""
    a = rng.stream(3, "my-protocol-noise", 1, "p1").random(4)
    assert np.array_equal(a, rng.stream(3, "my-protocol-noise", 1, "p1").random(4))
    assert not np.array_equal(a, rng.stream(3, "my-protocol-other", 1, "p1").random(4))
    code = rng._purpose("my-protocol-noise")
    assert code >= 2**31 > max(rng.PURPOSES.values())
    # the digest written out here: BLAKE2b-32 personalised "rayfed-purpose", top bit set
    import hashlib

    digest = hashlib.blake2b(b"my-protocol-noise", digest_size=4, person=b"rayfed-purpose")
    assert code == 2**31 + (int.from_bytes(digest.digest(), "little") >> 1)
