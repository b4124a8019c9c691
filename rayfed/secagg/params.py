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

Threat models (``threat_model``)
--------------------------------
``semi-honest`` (the default) is the analysis above: the server follows the protocol and pools
what it sees with ⌈γn⌉ corrupt clients. It does not cover a server that lies about who dropped.

``malicious`` follows Bell et al.'s malicious-security analysis of SecAgg+ (CCS 2020) for
a server that may show different clients different sets. The consistency round (signed
survivors lists U3, more than (n + c)/2 signatures needed) forces one U3 on every honest client,
but the server can still show a victim v a U2 that holds only a subset S of its k neighbours, so
that v's pairwise masks involve S only, and then declare S dropped: the honest neighbours outside
S see v in U3 and reveal shares of v's self-mask seed b_v, while S's other neighbours reveal the
mask keys s_w of S's members — no holder is asked for both shares of one owner, every check
passes, and y_v - PRG(b_v) - Σ_{w∈S} ±PRG(s_vw) = x_v. Let c_v of v's neighbours be corrupt (they
reveal both kinds, so the server puts them all in S). v masks only if |S| >= t (its own check),
and S's honest members, at least t - c_v of them, must be declared dropped and reveal nothing, so
at most k - (t - c_v) neighbours (the corrupt ones among them) can give b_v shares; the attack
needs k - (t - c_v) >= t, i.e. 2t <= k + c_v. It fails for every honest v
when t > (k + c_v)/2 for all of them, i.e. when no honest client has 2t - k corrupt neighbours:

* security, malicious: n · P[Hyp(n-1, ⌈γn⌉, k) >= 2t - k] <= 2^-σ
  (union bound over the honest clients; t <= k/2 is refused outright, as it falls with no
  corrupt neighbour at all. It implies the semi-honest share bound, since 2t - k <= t), with
  the connectivity bound above unchanged;
* correctness as above: n · P[Hyp(n-1, n-1-⌈δn⌉, k) < t] <= 2^-η.

Both pull t in opposite directions (t above (k + c)/2, t below the ~(1-δ)k survivors), so the
finder grows k until a t satisfies both; that needs δ well below (1 - γ)/2. On the complete graph
the conditions are exact: (n - 1 + ⌈γn⌉)/2 < t <= n - 1 - ⌈δn⌉. When even that is empty the finder
raises a ConfigError naming ``tolerated_dropout`` and the largest δ that works.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

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
    #: the server the bounds are for: "semi-honest" or "malicious" (see the module docstring)
    threat_model: str = "semi-honest"
    #: ⌈γn⌉, the clients the bounds assume colluding with the server
    corrupt: int = 0

    @property
    def honest_survivors(self) -> int:
        """The fewest honest clients in a sum the server accepts: ``min_survivors`` less the
        colluding clients, who know their own inputs — and any noise share they added. Noise
        that must protect a user against this coalition is counted over these clients only."""
        return self.min_survivors - self.corrupt

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def bounds(self) -> str:
        """The two failure bounds for the threat model, as the headlines print them (0: the
        failure cannot occur, e.g. fewer corrupt clients than 2t - k)."""

        def log2(x: float) -> str:
            return "0" if x == -math.inf else f"2^{x:.1f}"

        return (
            f"P[security failure] <= {log2(self.log2_security_failure)}, "
            f"P[abort] <= {log2(self.log2_correctness_failure)}"
        )


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


def _check_users(n: int) -> None:
    if not 2 <= n <= MAX_USERS:
        raise ConfigError(
            "users",
            f"must be in [2, {MAX_USERS:,}] for secure aggregation (share points are user "
            f"ids + 1 in the Shamir field GF(2^31 - 1)), got {n:,}",
            f"users <= {MAX_USERS:,}, or split the population into groups",
        )


def _check(n: int, dropout: float, corrupt: float, sigma: float, eta: float) -> None:
    _check_users(n)
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


ThreatModel = Literal["semi-honest", "malicious"]
THREAT_MODELS = ("semi-honest", "malicious")


def check_model(threat_model: str) -> None:
    if threat_model not in THREAT_MODELS:
        raise ConfigError("threat_model", f"unknown threat model {threat_model!r}", THREAT_MODELS)


def _t_min(k: int, n_corrupt: int, threat_model: str, complete: bool) -> int:
    """The smallest threshold the model admits outright. On the complete graph every client has
    all n_corrupt corrupt clients as neighbours: t > c (semi-honest; shares) or t > (k + c)/2
    (malicious; the isolation attack needs 2t <= k + c). On a sparse graph the corrupt neighbours
    are random and the bounds decide, beyond t > k/2 under malicious (2t <= k falls with no
    corrupt neighbour at all)."""
    malicious = threat_model == "malicious"
    if complete:
        return (k + n_corrupt) // 2 + 1 if malicious else n_corrupt + 1
    return k // 2 + 1 if malicious else 1


def _log2_isolation(n: int, k: int, t: int, n_corrupt: int) -> float:
    """log2 of n · P[Hyp(n-1, ⌈γn⌉, k) >= 2t - k]: some honest client has so many corrupt
    neighbours c that 2t <= k + c, and the malicious server can isolate it (t > k/2 here:
    ``_t_min``, checked before)."""
    if n_corrupt == 0:
        return -math.inf
    return math.log2(n) + _log2_sf(k, 2 * t - k, n_corrupt, n - 1)


def _no_malicious_threshold(n: int, n_drop: int, n_corrupt: int, dropout: float) -> ConfigError:
    t_min = _t_min(n - 1, n_corrupt, "malicious", complete=True)
    most = n - 1 - t_min  # the largest ⌈δn⌉ with t_min <= n - 1 - ⌈δn⌉
    fix = (
        f"tolerated_dropout <= {most / n:.4g} (then t > (n - 1 + corrupt)/2 and t <= the "
        "survivors can both hold), fewer corrupt clients, or threat_model=semi-honest"
        if most >= 0
        else "threat_model=semi-honest"
    )
    return ConfigError(
        "tolerated_dropout",
        f"{dropout:g} is too high for threat_model=malicious with n={n}: t must exceed "
        f"(n - 1 + {n_corrupt} corrupt)/2, so t >= {t_min}, yet at most n - 1 - {n_drop} = "
        f"{n - 1 - n_drop} neighbours survive",
        fix,
    )


def complete_params(
    n: int,
    dropout: float,
    corrupt: float,
    threshold: int | None = None,
    *,
    threat_model: ThreatModel = "semi-honest",
) -> SecAggParams:
    """SecAgg on the complete graph: ⌈γn⌉ < t <= n - 1 - ⌈δn⌉ (semi-honest) or
    (n - 1 + ⌈γn⌉)/2 < t <= n - 1 - ⌈δn⌉ (malicious); default t: the upper end."""
    check_model(threat_model)
    n_corrupt, n_drop = math.ceil(corrupt * n), math.ceil(dropout * n)
    malicious = threat_model == "malicious"
    t_min = _t_min(n - 1, n_corrupt, threat_model, complete=True)
    t_max = n - 1 - n_drop
    t = t_max if threshold is None else threshold
    if malicious and t_min > t_max:
        raise _no_malicious_threshold(n, n_drop, n_corrupt, dropout)
    if t_min > t_max or not t_min <= t <= t_max:
        rule = " (threat_model=malicious: t > (n - 1 + corrupt)/2)" if malicious else ""
        raise ConfigError(
            "threshold",
            f"no valid threshold for n={n}, {n_drop} dropouts and {n_corrupt} corrupt "
            f"clients (got {t}){rule}",
            f"{t_min} <= t <= {t_max}, or tolerate fewer dropouts",
        )
    return check_params(n, n - 1, t, dropout=dropout, corrupt=corrupt, threat_model=threat_model)


def check_params(
    n: int,
    degree: int,
    threshold: int,
    *,
    dropout: float,
    corrupt: float = 0.05,
    threat_model: ThreatModel = "semi-honest",
) -> SecAggParams:
    """Explicit degree and threshold (degree >= n - 1 means the complete graph), with their
    failure bounds computed as in :func:`find_params` for the report. Under ``malicious`` a
    threshold the isolation attack defeats outright (2t <= k + c on the complete graph, 2t <= k on
    a sparse one) is refused here; the plan refuses any whose bound misses sigma."""
    _check_users(n)
    check_model(threat_model)
    n_corrupt, n_drop = math.ceil(corrupt * n), math.ceil(dropout * n)
    complete = degree >= n - 1
    k = n - 1 if complete else degree
    malicious = threat_model == "malicious"
    if not complete and (degree < 2 or degree % 2):
        raise ConfigError(
            "degree",
            f"must be an even number >= 2 (or >= n-1 for the complete graph), got {degree}",
        )
    if not 1 <= threshold <= k:
        raise ConfigError("threshold", f"must be in [1, {k}] (the degree), got {threshold}")
    if malicious:
        t_min = _t_min(k, n_corrupt, threat_model, complete)
        if threshold < t_min:
            raise ConfigError(
                "threshold",
                f"{threshold} lets a malicious server isolate a user (it needs 2t <= k + "
                f"corrupt neighbours; k={k}" + (f", {n_corrupt} corrupt" if complete else "") + ")",
                f"threshold >= {t_min} (better: no override), or threat_model=semi-honest",
            )
    if complete:
        security = -math.inf if threshold > n_corrupt else 0.0
        correctness = -math.inf if threshold <= n - 1 - n_drop else 0.0
    else:
        if malicious:
            shares = _log2_isolation(n, k, threshold, n_corrupt)
        else:
            shares = (
                math.log2(n) + _log2_sf(k, threshold, n_corrupt, n - 1) if n_corrupt else -math.inf
            )
        security = max(shares, _log2_windows_removed(n, n_corrupt + n_drop, k))
        correctness = math.log2(n) + _log2_cdf(k, threshold, n - 1 - n_drop, n - 1)
    return SecAggParams(
        n, k, threshold, n - n_drop, complete, security, correctness, threat_model, n_corrupt
    )


def find_params(
    n: int,
    *,
    dropout: float,
    corrupt: float = 0.05,
    sigma: float = 40.0,
    eta: float = 30.0,
    graph: str = "auto",
    threat_model: ThreatModel = "semi-honest",
) -> SecAggParams:
    """Degree and threshold for ``n`` clients (``graph``: "auto", "complete" or "harary") against
    the ``threat_model``'s server (see the module docstring for both).

    Raises ConfigError when no sparse graph and no complete-graph threshold satisfy the bounds.
    """
    _check(n, dropout, corrupt, sigma, eta)
    check_model(threat_model)
    if threat_model == "malicious":
        return _find_malicious(n, dropout, corrupt, sigma, eta, graph)
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
                n,
                k,
                t_max,
                n - n_drop,
                False,
                max(security, connectivity),
                correctness,
                corrupt=n_corrupt,
            )
    if graph == "harary":
        raise ConfigError(
            "degree", f"no sparse graph meets the bounds for n={n}", "graph=complete or auto"
        )
    return complete_params(n, dropout, corrupt)


def _find_malicious(
    n: int, dropout: float, corrupt: float, sigma: float, eta: float, graph: str
) -> SecAggParams:
    """The smallest even k with a t that meets the malicious share bound, the connectivity bound
    and the correctness bound, and the largest such t; else the complete graph. The complete
    graph's exact condition is checked first: when it is empty no sparse graph can do better."""
    complete = complete_params(n, dropout, corrupt, threat_model="malicious")
    if graph == "complete":
        return complete
    n_corrupt, n_drop = math.ceil(corrupt * n), math.ceil(dropout * n)
    honest_survivors = n - 1 - n_drop
    log2n = math.log2(n)
    for k in range(2, n - 1, 2):
        if _log2_windows_removed(n, n_corrupt + n_drop, k) > -sigma:
            continue
        # the correctness bound grows with t: the largest t meeting it, by bisection
        lo, hi = _t_min(k, n_corrupt, "malicious", complete=False), k
        if log2n + _log2_cdf(k, lo, honest_survivors, n - 1) > -eta:
            continue  # not even t = k/2 + 1 is reached by enough survivors
        while lo < hi:  # lo meets it; find the largest that does
            mid = (lo + hi + 1) // 2
            if log2n + _log2_cdf(k, mid, honest_survivors, n - 1) <= -eta:
                lo = mid
            else:
                hi = mid - 1
        # the bounds as check_params computes them (connectivity already meets sigma here)
        found = check_params(n, k, lo, dropout=dropout, corrupt=corrupt, threat_model="malicious")
        if found.log2_security_failure <= -sigma:
            return found
    if graph == "harary":
        raise ConfigError(
            "degree",
            f"no sparse graph meets the malicious bounds for n={n}",
            "graph=complete or auto, a lower tolerated_dropout, or threat_model=semi-honest",
        )
    return complete
