"""The Shamir field: GF(2^31 - 1) (rayfed.secagg.shamir) against the former GF(2^20 + 7), whose
code is kept here, verbatim, as the reference timing. Times ``split`` and ``reconstruct`` at the
shapes SecAgg+ uses (a cohort of n/2 users sharing with the finder's k neighbours at its threshold
t; the server reconstructing n/2 secrets, each from t shares of its own holders; and the complete
graph at n = 10^3), and one secure-mode secure-sum round at n = 10^4 with either field (in process,
``backend=local``, the old field patched into the modules); then a dealer-mode round at
n = 2·10^6, beyond the old field, exact against the reference. Writes JSON.

    python benchmarks/shamir_field.py                         # ~5 minutes on 2 cores
    python benchmarks/shamir_field.py --no-round --no-dealer  # the Shamir shapes only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import types
from pathlib import Path

import numpy as np

import rayfed
from rayfed.secagg import client, server, shamir
from rayfed.secagg.params import complete_params, find_params

# --- the former field, rayfed.secagg.shamir before issue 29 (reference timing only) --------------
OLD_SOURCE = '''
from __future__ import annotations

import numpy as np

P = (1 << 20) + 7
CHUNK_BITS = 20
CHUNKS = 13  # ceil(256 / 20)
SECRET_BYTES = 32
_BLOCK = 4096
MAX_USERS = P - 2


def secret_to_chunks(secrets: np.ndarray) -> np.ndarray:
    """(S, 32) uint8 → (S, 13) int64 chunks of 20 bits (big-endian bit order)."""
    bits = np.unpackbits(np.asarray(secrets, dtype=np.uint8), axis=1)  # (S, 256)
    padded = np.concatenate(
        [np.zeros((bits.shape[0], CHUNKS * CHUNK_BITS - 256), np.uint8), bits], axis=1
    )
    weights = 1 << np.arange(CHUNK_BITS - 1, -1, -1, dtype=np.int64)
    return padded.reshape(-1, CHUNKS, CHUNK_BITS).astype(np.int64) @ weights


def chunks_to_secret(chunks: np.ndarray) -> np.ndarray:
    """Inverse of :func:`secret_to_chunks`; ValueError if a chunk is not a 20-bit value."""
    chunks = np.asarray(chunks, dtype=np.int64)
    if chunks.size and (chunks.min() < 0 or chunks.max() >= 1 << CHUNK_BITS):
        raise ValueError("reconstructed chunk out of range: shares are inconsistent")
    shifts = np.arange(CHUNK_BITS - 1, -1, -1, dtype=np.int64)
    bits = ((chunks[:, :, None] >> shifts) & 1).astype(np.uint8).reshape(chunks.shape[0], -1)
    if bits[:, : CHUNKS * CHUNK_BITS - 256].any():
        raise ValueError("reconstructed secret exceeds 256 bits: shares are inconsistent")
    return np.packbits(bits[:, CHUNKS * CHUNK_BITS - 256 :], axis=1)


def _powers(x: np.ndarray, t: int) -> np.ndarray:
    """x^0 .. x^(t-1) mod p along a new last axis (exact in int64)."""
    out = np.empty((*x.shape, t), dtype=np.int64)
    out[..., 0] = 1
    for k in range(1, t):
        out[..., k] = out[..., k - 1] * x % P
    return out


def _matmul_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(…, K) @ (…, K, C) mod p, exact: float64 BLAS in blocks of at most 4096 terms."""
    k = a.shape[-1]
    out = None
    for s in range(0, k, _BLOCK):
        part = np.matmul(
            a[..., s : s + _BLOCK].astype(np.float64), b[..., s : s + _BLOCK, :].astype(np.float64)
        )
        part = np.fmod(part, P)
        out = part if out is None else np.fmod(out + part, P)
    return out.astype(np.int64)


def split(secrets: np.ndarray, points: np.ndarray, t: int, coef_words: np.ndarray) -> np.ndarray:
    """Shares of each secret at its points.

    Parameters
    ----------
    secrets:
        (S, 32) uint8.
    points:
        (K,) int — the same x-coordinates for every secret — or (S, K).
    t:
        Threshold: any t shares reconstruct, fewer reveal nothing.
    coef_words:
        (S, t - 1, 13) uint64 random words for the non-constant coefficients (reduced mod p;
        the bias of a 64-bit word mod p is below 2^-43).

    Returns
    -------
    (S, K, 13) int64 shares.
    """
    secrets = np.asarray(secrets, dtype=np.uint8)
    coefs = np.empty((secrets.shape[0], t, CHUNKS), dtype=np.int64)
    coefs[:, 0] = secret_to_chunks(secrets)
    if t > 1:
        coefs[:, 1:] = (np.asarray(coef_words, dtype=np.uint64) % np.uint64(P)).astype(np.int64)
    points = np.asarray(points, dtype=np.int64) % P
    if points.ndim == 1:  # one Vandermonde matrix for all secrets: a single large product
        vander = _powers(points, t)  # (K, t)
        flat = coefs.transpose(1, 0, 2).reshape(t, -1)  # (t, S*13)
        return (
            _matmul_mod(vander, flat)
            .reshape(len(points), secrets.shape[0], CHUNKS)
            .transpose(1, 0, 2)
        )
    out = np.empty((*points.shape, CHUNKS), dtype=np.int64)
    step = max(1, (1 << 22) // max(1, points.shape[1] * t))
    for s in range(0, points.shape[0], step):
        out[s : s + step] = _matmul_mod(_powers(points[s : s + step], t), coefs[s : s + step])
    return out


def _modpow(a: np.ndarray, e: int) -> np.ndarray:
    result = np.ones_like(a)
    base = a % P
    while e:
        if e & 1:
            result = result * base % P
        base = base * base % P
        e >>= 1
    return result


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """(S, t) distinct non-zero points → (S, t) Lagrange coefficients λ_j = Π_{m≠j} x_m / (x_m - x_j)."""
    xs = np.asarray(xs, dtype=np.int64) % P
    num = np.ones_like(xs)
    den = np.ones_like(xs)
    for m in range(xs.shape[1]):
        xm = xs[:, m : m + 1]
        other = np.arange(xs.shape[1]) != m
        num = np.where(other, num * xm % P, num)
        den = np.where(other, den * ((xm - xs) % P) % P, den)
    return num * _modpow(den, P - 2) % P


def lagrange_leave_one_out(xs: np.ndarray) -> np.ndarray:
    """For t+1 points C: (t+1, t+1) matrix whose row r holds the coefficients of C without point r
    (column r is 0). λ_j(C∖r) = λ_j(C) · (x_r - x_j) / x_r, so all t+1 sets cost O(t²) in total."""
    xs = np.asarray(xs, dtype=np.int64).reshape(1, -1) % P
    lam = lagrange_at_zero(xs)[0]
    x = xs[0]
    out = lam[None, :] * ((x[:, None] - x[None, :]) % P) % P * _modpow(x, P - 2)[:, None] % P
    np.fill_diagonal(out, 0)
    return out


def combine(lam: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Σ_j λ_j y_j mod p for (S, t) coefficients and (S, t, 13) shares → (S, 32) uint8 secrets."""
    chunks = (np.asarray(lam, np.int64)[:, :, None] * np.asarray(ys, np.int64) % P).sum(axis=1) % P
    return chunks_to_secret(chunks)


def reconstruct(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Secrets from t shares each: xs (S, t) points, ys (S, t, 13) shares → (S, 32) uint8.

    Lagrange coefficients cost O(t²) per distinct point set; secrets whose shares come from the
    same holders share one computation.
    """
    xs = np.asarray(xs, dtype=np.int64)
    ys = np.asarray(ys, dtype=np.int64)
    order = np.argsort(xs, axis=1)
    xs = np.take_along_axis(xs, order, axis=1)
    ys = np.take_along_axis(ys, order[:, :, None], axis=1)
    sets, which = np.unique(xs, axis=0, return_inverse=True)
    return combine(lagrange_at_zero(sets)[which.reshape(-1)], ys)
'''
old = types.ModuleType("shamir_2p20")
exec(compile(OLD_SOURCE, "shamir_2p20", "exec"), old.__dict__)
old.COEF_WORDS = old.CHUNKS  # one word per coefficient


def _best(repeat: int, fn, *args) -> tuple[float, float]:
    """The fastest of ``repeat`` calls: (wall seconds, this process's CPU seconds — all its
    threads — which a load from other processes on the shared cores barely moves)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(*args)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def shapes(n: int, complete: bool, repeat: int) -> dict:
    """split and reconstruct times for both fields at n's shape; the shares of either field are
    checked to reconstruct their secrets."""
    gen = np.random.default_rng(n)
    params = complete_params(n, 0.3, 0.05) if complete else find_params(n, dropout=0.3)
    k, t = params.degree, params.threshold
    users = n // 2
    secrets = gen.integers(0, 256, (users, 32), dtype=np.uint8)
    if complete:
        points = np.arange(1, n + 1)
        holders = np.broadcast_to(points, (users, n))
    else:  # each user's k neighbours, as ids + 1 (a random stand-in for the Harary graph)
        holders = (gen.random((users, n)).argsort(axis=1)[:, :k] + 1) if n <= 10**4 else None
        if holders is None:
            holders = np.stack([gen.choice(n, k, replace=False) for _ in range(users)]) + 1
        points = holders
    pick = np.stack([gen.choice(points.shape[-1], t, replace=False) for _ in range(users)])
    xs = np.take_along_axis(holders, pick, axis=1)
    row = {"n": n, "graph": "complete" if complete else "harary", "k": k, "t": t, "secrets": users}
    for name, field in (("old", old), ("new", shamir)):
        words = gen.integers(0, 2**64, (users, t - 1, field.COEF_WORDS), dtype=np.uint64)
        shares = field.split(secrets, points, t, words)
        ys = np.take_along_axis(shares, pick[:, :, None], axis=1)
        assert np.array_equal(field.reconstruct(xs, ys), secrets)
        for op, args in (("split", (secrets, points, t, words)), ("reconstruct", (xs, ys))):
            wall, cpu = _best(repeat, getattr(field, op), *args)
            row[f"{op}_s_{name}"], row[f"{op}_cpu_s_{name}"] = round(wall, 4), round(cpu, 4)
    for op in ("split", "reconstruct"):
        row[f"{op}_new_over_old"] = round(row[f"{op}_s_new"] / row[f"{op}_s_old"], 3)
        row[f"{op}_cpu_new_over_old"] = round(row[f"{op}_cpu_s_new"] / row[f"{op}_cpu_s_old"], 3)
    row["target"] = "cpu_new_over_old <= 1.0 (n <= 10^5 does not slow down)"
    row["met"] = all(row[f"{op}_cpu_new_over_old"] <= 1.0 for op in ("split", "reconstruct"))
    return row


@contextlib.contextmanager
def old_field():
    """The former field patched into the modules that use it (in process only)."""
    names = ["P", "CHUNK_BITS", "CHUNKS", "COEF_WORDS", "MAX_USERS", "split", "reconstruct",
             "combine", "lagrange_at_zero", "lagrange_leave_one_out"]  # fmt: skip
    saved = {a: getattr(shamir, a) for a in names}
    saved_bytes = (client.SHARE_WORDS, client.PLAINTEXT_BYTES, server.PLAINTEXT_BYTES)
    for a in names:
        setattr(shamir, a, getattr(old, a))
    client.SHARE_WORDS = 2 * old.CHUNKS
    client.PLAINTEXT_BYTES = server.PLAINTEXT_BYTES = 4 * client.SHARE_WORDS
    try:
        yield
    finally:
        for a, v in saved.items():
            setattr(shamir, a, v)
        client.SHARE_WORDS, client.PLAINTEXT_BYTES, server.PLAINTEXT_BYTES = saved_bytes


def secure_round(n: int, dim: int) -> dict:
    row: dict = {"n": n, "dim": dim, "mode": "secure", "backend": "local", "cohorts": 2}
    for name in ("old", "new"):
        ctx = old_field() if name == "old" else contextlib.nullcontext()
        with ctx:
            start, start_cpu = time.perf_counter(), time.process_time()
            result = rayfed.run(
                "secure-sum", backend="local", out_dir=None, users=n, dim=dim, mode="secure",
                cohorts=2, seed=1,
            )  # fmt: skip
            seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        assert result.metrics["exact"], name
        row[f"seconds_{name}"], row[f"cpu_seconds_{name}"] = round(seconds, 2), round(cpu, 2)
        row[f"phase_seconds_{name}"] = {
            k: round(v, 3) for k, v in result.metrics["phase_seconds"].items()
        }
        row["k"], row["t"] = result.metrics["degree"], result.metrics["threshold"]
    row["new_over_old"] = round(row["seconds_new"] / row["seconds_old"], 3)
    row["cpu_new_over_old"] = round(row["cpu_seconds_new"] / row["cpu_seconds_old"], 3)
    row["target"] = "cpu_new_over_old <= 1.0 (in process: the CPU time is the whole round's)"
    row["met"] = row["cpu_new_over_old"] <= 1.0
    return row


def dealer_row(n: int, dim: int) -> dict:
    """One dealer-mode secure-sum round beyond the former field's 1,048,581 users: exact against
    the protocol's independent reference (rayfed.secagg.reference)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    result = rayfed.run(
        "secure-sum", backend="local", out_dir=None, users=n, dim=dim, mode="dealer", cohorts=2,
        seed=1,
    )  # fmt: skip
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    m = result.metrics
    return {
        "n": n, "dim": dim, "mode": "dealer", "backend": "local", "cohorts": 2,
        "k": m["degree"], "t": m["threshold"], "exact": m["exact"], "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "beyond_old_field": n > old.MAX_USERS,
        "target": "exact, n = 2*10^6 > 1,048,581 (a test needs > 30 s on 2 cores: kept here)",
        "met": bool(m["exact"] and n > old.MAX_USERS),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/shamir_field.json")
    p.add_argument("--no-round", action="store_true", help="skip the secure-sum round")
    p.add_argument("--no-dealer", action="store_true", help="skip the 2*10^6-user dealer round")
    args = p.parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for n, complete, repeat in (
        (10**3, False, 5),
        (10**3, True, 3),
        (10**4, False, 3),
        (10**5, False, 1),
    ):
        rows.append(shapes(n, complete, repeat))
        print(json.dumps(rows[-1]), flush=True)
    out: dict = {
        "fields": {"old": f"GF(2^20 + 7), {old.CHUNKS} chunks, max users {old.MAX_USERS:,}",
                   "new": f"GF(2^31 - 1), {shamir.CHUNKS} chunks, max users {shamir.MAX_USERS:,}"},
        "shapes": rows,
    }  # fmt: skip
    if not args.no_round:
        out["secure_round"] = secure_round(10**4, 10)
        print(json.dumps(out["secure_round"]), flush=True)
    if not args.no_dealer:
        out["dealer_2m"] = dealer_row(2_000_000, 4)
        print(json.dumps(out["dealer_2m"]), flush=True)
    out["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_before": load,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
