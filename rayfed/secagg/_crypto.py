"""HAZARDOUS MATERIALS: the cryptographic primitives of secure aggregation.

Private to ``rayfed.secagg``; protocols use the recipe in :mod:`rayfed.secagg` instead. Everything
here is built on ``cryptography`` (pyca): X25519 key agreement, HKDF-SHA256, AES-256-GCM and an
AES-256-CTR keystream as PRG. Rules this module relies on:

* X25519 keys are fresh per aggregation round, so every derived key is per (round, pair).
* AES-GCM: NEVER REUSE A NONCE under one key. A pair key is shared by exactly two users and each
  encrypts exactly one message with it per round, so the nonce is the *sender's* id: the two
  messages under one key have different nonces. The associated data binds (tag, round, sender,
  receiver): a ciphertext cannot be replayed into another round or rerouted to another receiver.
* The PRG is AES-256-CTR with a zero IV over a key used for one stream only (a self-mask seed, or
  a pairwise seed both ends expand identically).
"""

from __future__ import annotations

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
TAG_BYTES = 16
INFO_SHARE = b"rayfed-secagg/v1/share-encryption"
INFO_MASK = b"rayfed-secagg/v1/pairwise-mask"
_ZERO_IV = bytes(16)

__all__ = [
    "InvalidTag",
    "decrypt_share",
    "encrypt_share",
    "expand",
    "hkdf",
    "keypair",
    "Prf",
    "prf_blocks",
    "public_keys",
    "shared_secret",
    "signing_keypair",
    "verify",
]


def keypair(private_bytes: bytes) -> tuple[X25519PrivateKey, bytes]:
    """An X25519 private key from 32 bytes (OS or seeded) and its raw public key."""
    sk = X25519PrivateKey.from_private_bytes(private_bytes)
    return sk, sk.public_key().public_bytes_raw()


def signing_keypair(private_bytes: bytes) -> tuple[Ed25519PrivateKey, bytes]:
    """An Ed25519 signing key from 32 bytes (OS or seeded) and its raw public key."""
    sk = Ed25519PrivateKey.from_private_bytes(private_bytes)
    return sk, sk.public_key().public_bytes_raw()


def verify(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under ``public_raw``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def public_keys(raw: np.ndarray) -> list[X25519PublicKey]:
    """Key objects for (n, 32) raw public keys (parsed once, used for every agreement)."""
    return [X25519PublicKey.from_public_bytes(row.tobytes()) for row in raw]


def shared_secret(sk: X25519PrivateKey, peer: X25519PublicKey) -> bytes:
    """Raw X25519 shared secret; raises ValueError for a low-order (all-zero result) peer key."""
    return sk.exchange(peer)


def hkdf(secret: bytes, info: bytes, salt: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) of a shared secret into a 32-byte key."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(secret)


def _nonce(sender: int) -> bytes:
    return int(sender).to_bytes(8, "little") + bytes(4)


def associated_data(tag: bytes, round: int, sender: int, receiver: int) -> bytes:
    return b"%s|%d|%d|%d" % (tag, round, sender, receiver)


def encrypt_share(
    key: bytes, plaintext: bytes, *, tag: bytes, round: int, sender: int, receiver: int
) -> bytes:
    return AESGCM(key).encrypt(
        _nonce(sender), plaintext, associated_data(tag, round, sender, receiver)
    )


def decrypt_share(
    key: bytes, ciphertext: bytes, *, tag: bytes, round: int, sender: int, receiver: int
) -> bytes:
    """Raises cryptography's InvalidTag if the ciphertext, its routing or its round was altered."""
    return AESGCM(key).decrypt(
        _nonce(sender), ciphertext, associated_data(tag, round, sender, receiver)
    )


_zeros = np.zeros(0, dtype=np.uint8)


def _zero_bytes(n: int) -> memoryview:
    global _zeros
    if _zeros.size < n:
        _zeros = np.zeros(max(n, 2 * _zeros.size), dtype=np.uint8)
    return memoryview(_zeros)[:n]


def expand(seed: bytes, n_words: int, dtype=np.uint32) -> np.ndarray:
    """PRG: ``n_words`` words of AES-256-CTR keystream under ``seed`` (32 bytes)."""
    dtype = np.dtype(dtype)
    nbytes = n_words * dtype.itemsize
    buf = np.empty(nbytes + 15, dtype=np.uint8)
    Cipher(algorithms.AES(seed), modes.CTR(_ZERO_IV)).encryptor().update_into(
        _zero_bytes(nbytes), buf
    )
    return buf[:nbytes].view(dtype)


class Prf:
    """AES-256 as a PRF on 16-byte inputs (code, block index) → 16·n_blocks bytes per code.

    ECB over many inputs under one key in one call: the dealer mode derives every seed and mask of
    a round from one key this way, with no per-pair key setup. Input and output buffers are
    allocated once and reused (fresh memory is slow to fault in here): each call's result is only
    valid until the next call.
    """

    def __init__(self, key: bytes, n_blocks: int, max_codes: int):
        self.n_blocks = n_blocks
        self._inp = np.empty((max_codes, n_blocks, 2), dtype="<u8")
        self._inp[:, :, 1] = np.arange(n_blocks, dtype=np.uint64)[None, :]
        self._out = np.empty(max_codes * n_blocks * 16 + 15, dtype=np.uint8)
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()

    def __call__(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.uint64)
        inp = self._inp[: codes.size]
        inp[:, :, 0] = codes[:, None]
        self._enc.update_into(inp.reshape(-1).view(np.uint8), self._out)
        return self._out[: inp.nbytes].reshape(codes.size, 16 * self.n_blocks)


def prf_blocks(key: bytes, codes: np.ndarray, n_blocks: int) -> np.ndarray:
    """:class:`Prf` on a few codes, as a fresh array."""
    return Prf(key, n_blocks, max(1, np.size(codes)))(codes).copy()
