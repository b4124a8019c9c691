"""Choosing the neighbour graph's degree k and the Shamir threshold t (SecAgg / SecAgg+).

The conditions are those of Bell, Bonawitz, Gascón, Lepoint & Raykova, "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead" (CCS 2020) for a semi-honest server colluding with
a fraction γ of the clients, with a fraction δ of the clients dropping out. The graph is their
random Harary graph: the ring power C_n^(k/2) with nodes relabelled by a uniformly random public
permutation, so every node's k neighbours are a uniformly random k-subset of the other n - 1 and
the corrupt and dropped sets (chosen independently of the permutation) are uniform on the ring.
The bounds below are our own union bounds for that graph, each computed exactly:

* security, shares:   n · P[Hyp(n-1, ⌈γn⌉, k) >= t] <= 2^-σ
  (no honest client has t corrupt neighbours, who could otherwise pool both of its secrets);
* security, partial sums: n² · (r)_k / (n)_k <= 2^-σ, r = ⌈γn⌉ + ⌈δn⌉
  (the honest survivors stay connected: removing nodes from C_n^(k/2) disconnects it only if two
  disjoint windows of k/2 consecutive ring positions are entirely removed; the server would then
  learn the sum of a component);
* correctness:        n · P[Hyp(n-1, n-1-⌈δn⌉, k) < t] <= 2^-η
  (every client keeps t surviving neighbours, so each secret the server needs is recoverable).

The finder takes the smallest even k for which some t satisfies all three and then the largest
such t (maximal security margin at the required correctness). When k would reach n - 1 it uses
the complete graph (SecAgg, Bonawitz et al. CCS 2017), where the conditions become exact counts:
⌈γn⌉ < t <= n - 1 - ⌈δn⌉. The server aborts a round when fewer than ``min_survivors``
= n - ⌈δn⌉ clients remain at any phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import hypergeom

from rayfed.errors import ConfigError
from rayfed.secagg.shamir import MAX_USERS


@dataclass(frozen=True)
class SecAggParams:
    """A resolved neighbour graph and threshold (see the module docstring for the bounds)."""

    n: int
    degree: int
    threshold: int
    min_survivors: int
    complete: bool
    log2_security_failure: float
    log2_correctness_failure: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _log2_sf(k: int, t: int, good: int, n_other: int) -> float:
    """log2 P[Hyp(n_other, good, k) >= t]."""
    return float(hypergeom.logsf(t - 1, n_other, good, k)) / math.log(2)


def _log2_cdf(k: int, t: int, good: int, n_other: int) -> float:
    """log2 P[Hyp(n_other, good, k) < t]."""
    return float(hypergeom.logcdf(t - 1, n_other, good, k)) / math.log(2)


def _log2_windows_removed(n: int, removed: int, k: int) -> float:
    """log2 of n² (r)_k / (n)_k: two disjoint windows of k/2 ring positions all removed."""
    if removed < k:
        return -math.inf
    return 2 * math.log2(n) + sum(math.log2((removed - i) / (n - i)) for i in range(k))


def _check(n: int, dropout: float, corrupt: float, sigma: float, eta: float) -> None:
    if not 2 <= n <= MAX_USERS:
        raise ConfigError("users", f"must be in [2, {MAX_USERS}] for secure aggregation, got {n}")
    if not 0 <= dropout < 1:
        raise ConfigError("tolerated_dropout", f"must be in [0, 1), got {dropout}")
    if not 0 <= corrupt < 0.5:
        raise ConfigError("corrupt_fraction", f"must be in [0, 0.5), got {corrupt}")
    if dropout + corrupt >= 1:
        raise ConfigError(
            "tolerated_dropout",
            "dropouts plus corrupt clients leave no honest survivor",
            "tolerated_dropout + corrupt_fraction < 1",
        )
    if sigma <= 0 or eta <= 0:
        raise ConfigError("sigma", f"security parameters must be > 0, got sigma={sigma}, eta={eta}")


def complete_params(
    n: int, dropout: float, corrupt: float, threshold: int | None = None
) -> SecAggParams:
    """SecAgg on the complete graph: ⌈γn⌉ < t <= n - 1 - ⌈δn⌉ (default: the upper end)."""
    n_corrupt, n_drop = math.ceil(corrupt * n), math.ceil(dropout * n)
    t_min, t_max = n_corrupt + 1, n - 1 - n_drop
    t = t_max if threshold is None else threshold
    if t_min > t_max or not t_min <= t <= t_max:
        raise ConfigError(
            "threshold",
            f"no valid threshold for n={n}, {n_drop} dropouts and {n_corrupt} corrupt "
            f"clients (got {t})",
            f"{t_min} <= t <= {t_max}, or tolerate fewer dropouts",
        )
    return SecAggParams(n, n - 1, t, n - n_drop, True, -math.inf, -math.inf)


def check_params(
    n: int, degree: int, threshold: int, *, dropout: float, corrupt: float = 0.05
) -> SecAggParams:
    """Explicit degree and threshold (degree >= n - 1 means the complete graph), with their
    failure bounds computed as in :func:`find_params` for the report."""
    n_corrupt, n_drop = math.ceil(corrupt * n), math.ceil(dropout * n)
    complete = degree >= n - 1
    k = n - 1 if complete else degree
    if not complete and (degree < 2 or degree % 2):
        raise ConfigError(
            "degree",
            f"must be an even number >= 2 (or >= n-1 for the complete graph), got {degree}",
        )
    if not 1 <= threshold <= k:
        raise ConfigError("threshold", f"must be in [1, {k}] (the degree), got {threshold}")
    if complete:
        security = -math.inf if threshold > n_corrupt else 0.0
        correctness = -math.inf if threshold <= n - 1 - n_drop else 0.0
    else:
        security = max(
            math.log2(n) + _log2_sf(k, threshold, n_corrupt, n - 1) if n_corrupt else -math.inf,
            _log2_windows_removed(n, n_corrupt + n_drop, k),
        )
        correctness = math.log2(n) + _log2_cdf(k, threshold, n - 1 - n_drop, n - 1)
    return SecAggParams(n, k, threshold, n - n_drop, complete, security, correctness)


def find_params(
    n: int,
    *,
    dropout: float,
    corrupt: float = 0.05,
    sigma: float = 40.0,
    eta: float = 30.0,
    graph: str = "auto",
) -> SecAggParams:
    """Degree and threshold for ``n`` clients (``graph``: "auto", "complete" or "harary").

    Raises ConfigError when no sparse graph and no complete-graph threshold satisfy the bounds.
    """
    _check(n, dropout, corrupt, sigma, eta)
    if graph == "complete":
        return complete_params(n, dropout, corrupt)
    n_corrupt, n_drop = math.ceil(corrupt * n), math.ceil(dropout * n)
    honest_survivors = n - 1 - n_drop
    for k in range(2, n - 1, 2):
        if _log2_windows_removed(n, n_corrupt + n_drop, k) > -sigma:
            continue
        t_max = None
        for t in range(k, 0, -1):  # largest t with the correctness bound
            if math.log2(n) + _log2_cdf(k, t, honest_survivors, n - 1) <= -eta:
                t_max = t
                break
        if t_max is None:
            continue
        security = math.log2(n) + _log2_sf(k, t_max, n_corrupt, n - 1) if n_corrupt else -math.inf
        if security <= -sigma:
            correctness = math.log2(n) + _log2_cdf(k, t_max, honest_survivors, n - 1)
            connectivity = _log2_windows_removed(n, n_corrupt + n_drop, k)
            return SecAggParams(
                n, k, t_max, n - n_drop, False, max(security, connectivity), correctness
            )
    if graph == "harary":
        raise ConfigError(
            "degree", f"no sparse graph meets the bounds for n={n}", "graph=complete or auto"
        )
    return complete_params(n, dropout, corrupt)
