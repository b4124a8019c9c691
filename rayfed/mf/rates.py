"""The default learning rate of VFL's and HFL's DP-SGD: a public rule of the noise (issue 30).

The best rate grows as the noise shrinks (benchmarks/federated_mf_lr_rule.py: on ML-100K, from
about 0.15 at ε = 0.5 to about 50 without noise), so no constant serves every ε. The rule reads
only what the run already publishes or takes as public — the noise multiplier z, the sensitivity
Δ, the sampling rate η, the batch normalisers b_k = η·|Ω_k| and the averaging weights w_k, the
T·T' steps, the bound R, the rank p and the shape (n, m) — never a rating.

- **Noise-bound.** Each step moves the server's average (U in VFL, V in HFL) by γ times a
  Gaussian of per-coordinate standard deviation σ = zΔ·√(Σ_k (w_k/b_k)²); over S = T·T' steps the
  walk grows to γσ√S. The rule keeps it at κ times a coordinate's typical size √(R/p):
  γ_noise = κ·√(R/p) / (σ·√S).
- **Signal-bound.** Without noise a step is stable while γ times the gradient's curvature stays
  below one; a gradient sum divided by b reaches a row of U (of V) with weight about 1/n (1/m),
  so γ_signal = c·min(n, m) / R.
- γ0 = min(γ_noise, γ_signal), decaying linearly to γ0/10 over 80 % of the steps (spec §5.3).

κ and c are fitted once on ML-100K, public data (benchmarks/federated_mf_lr_rule.py), and checked
there on data the fit never saw (docs/protocols/federated-mf.md, "Learning rates: a public rule
of the noise"; benchmarks/README.md, "federated-mf: the learning-rate rule")."""

from __future__ import annotations

import math
from collections.abc import Iterable

#: κ: the noise walk's target, in units of √(R/p) (fitted on ML-100K, 5 parties)
NOISE_WALK = 1.3
#: c: the signal bound's constant, from ML-100K without noise (min(n, m) = 943, R = 5), whose test MSE
#: is flat within 0.001 from γ = 38 to 60: 0.32 puts it at 60 (a refit around there gives 0.26)
SIGNAL_CAP = 0.32
#: the rule's decay: γ_end = γ0 · DECAY (spec §5.3's linear decay to a tenth)
DECAY = 0.1


def average_noise(
    z: float, sensitivity: float, batches: Iterable[tuple[float, float]], *, averaged: bool = True
) -> float:
    """σ: the per-coordinate standard deviation, per unit rate, that one step's noise leaves in
    the embedding each party continues from, over parties' (weight w_k, batch normaliser b_k):
    the server's weighted average, zΔ·√(Σ_k (w_k/b_k)²); without an average (VFL's local-only
    baseline) each party's own, zΔ/b_k, their root mean square over the parties."""
    batches = list(batches)
    if averaged:
        return z * sensitivity * math.sqrt(sum((w / b) ** 2 for w, b in batches))
    return z * sensitivity * math.sqrt(sum(1 / b**2 for _, b in batches) / len(batches))


def dp_sgd_rate(
    *,
    noise: float | None,
    steps: int,
    bound: float,
    rank: int,
    users: int,
    items: int,
) -> float:
    """γ0, the starting rate: min(κ·√(R/p)/(σ·√S), c·min(n, m)/R); ``noise`` is σ of
    :func:`average_noise`, None without noise (the signal bound alone)."""
    signal = SIGNAL_CAP * min(users, items) / bound
    if noise is None or noise == 0:
        return signal
    return min(NOISE_WALK * math.sqrt(bound / rank) / (noise * math.sqrt(steps)), signal)
