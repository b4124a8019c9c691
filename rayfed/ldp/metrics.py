"""Utility metrics of a d-bucket estimate x̂ against the true histogram x on [0, 1] (spec §3), in
the units the spec fixes: Wasserstein-1 in continuous units (the sum of |ΔCDF| over buckets times
the bucket width 1/d), KS, range-query MAE with the CDF interpolated linearly inside buckets,
mean and variance from bucket centres, quantiles in [0, 1] units."""

from __future__ import annotations

import numpy as np

QUANTILES = np.arange(1, 10) / 10.0
RANGE_WIDTHS = (0.1, 0.4)


def cdf_at(x: np.ndarray, points: np.ndarray) -> np.ndarray:
    """P(x, t) for t in [0, 1], linear inside buckets."""
    edges = np.linspace(0.0, 1.0, x.size + 1)
    return np.interp(points, edges, np.concatenate([[0.0], np.cumsum(x)]))


def wasserstein(x: np.ndarray, est: np.ndarray) -> float:
    return float(np.abs(np.cumsum(x) - np.cumsum(est)).sum() / x.size)


def kolmogorov_smirnov(x: np.ndarray, est: np.ndarray) -> float:
    return float(np.abs(np.cumsum(x) - np.cumsum(est)).max())


def range_query_error(x: np.ndarray, est: np.ndarray, alpha: float, starts: np.ndarray) -> float:
    """MAE of R(i, α) = P(i + α) - P(i) over the query starts (uniform in [0, 1 - α])."""
    true = cdf_at(x, starts + alpha) - cdf_at(x, starts)
    got = cdf_at(est, starts + alpha) - cdf_at(est, starts)
    return float(np.abs(true - got).mean())


def moments(x: np.ndarray) -> tuple[float, float]:
    """(mean, variance) of a histogram, from its bucket centres."""
    centres = (np.arange(x.size) + 0.5) / x.size
    mean = float(x @ centres)
    return mean, float(x @ (centres - mean) ** 2)


def quantiles(x: np.ndarray, levels: np.ndarray = QUANTILES) -> np.ndarray:
    """Q(β) in [0, 1]: the inverse of the linearly interpolated CDF."""
    edges = np.linspace(0.0, 1.0, x.size + 1)
    cdf = np.concatenate([[0.0], np.cumsum(x)])
    cdf = np.maximum.accumulate(cdf)
    return np.interp(levels, cdf + np.arange(cdf.size) * 1e-15, edges)


def all_metrics(
    x: np.ndarray, est: np.ndarray, starts: dict[float, np.ndarray]
) -> dict[str, float]:
    """Every histogram metric of the spec's Table 3.2."""
    (m, v), (m_hat, v_hat) = moments(x), moments(est)
    out = {
        "wasserstein": wasserstein(x, est),
        "ks": kolmogorov_smirnov(x, est),
        "mean_error": abs(m - m_hat),
        "variance_error": abs(v - v_hat),
        "quantile_error": float(np.abs(quantiles(x) - quantiles(est)).mean()),
    }
    for alpha in RANGE_WIDTHS:
        out[f"range_error_{alpha:g}"] = range_query_error(x, est, alpha, starts[alpha])
    return out


def range_starts(rng: np.random.Generator, count: int = 1000) -> dict[float, np.ndarray]:
    return {alpha: rng.uniform(0.0, 1.0 - alpha, count) for alpha in RANGE_WIDTHS}
