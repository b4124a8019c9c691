"""What a run of ``federated-mf``'s VFL or HFL setting reports: the per-party evaluation table,
metrics, headline and privacy notes."""

from __future__ import annotations

import pyarrow as pa

from rayfed.protocols.base import Outcome
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.partitioned.params import PartitionedParams

LOCAL_NOTE = (
    "local non-private SGD baseline: each party trains on its own data only; nothing is released"
)
RATING_GAP_NOTE = (
    "per-rating in HFL has a gap (spec §7.8): the pre-trained u_i depends on all of the user's "
    "ratings; per-user (privacy_unit=user) is sound"
)


EVALUATION_NOTE = (
    "test_mse and train_mse are computed on the raw ratings, outside the protocol: a "
    "simulation's evaluation, not covered by the guarantee (nor is a learning rate tuned on them)"
)

NOT_PRIVATE_NOTE = (
    "noise=none: the federated algorithm without noise, a non-private reference — no DP "
    "guarantee holds and the ledger is empty"
)


def vfl_noise_note(cfg: FederatedMFConfig, params: PartitionedParams) -> str:
    if params.z is None:
        return NOT_PRIVATE_NOTE
    return (
        f"noise multiplier z = {params.z:.4g} (σ = z·Δ, Δ = {params.delta_joint:.4g} joint, "
        f"{params.delta_v:.4g} fine-tuning) for "
        f"{cfg.iterations}x{cfg.local_steps}+{cfg.finetune_steps} "
        f"steps at η = {cfg.sampling_rate:g}, δ = {params.delta:.3g}"
    )


def outcome(
    cfg: FederatedMFConfig,
    params: PartitionedParams,
    parts: dict[str, tuple[float, int, float, int]],
) -> Outcome:
    """Pooled test and training MSE over the parties' evaluation replies (test sse, count, train
    sse, count)."""
    test_mse = sum(v[0] for v in parts.values()) / max(1, sum(v[1] for v in parts.values()))
    train_mse = sum(v[2] for v in parts.values()) / max(1, sum(v[3] for v in parts.values()))
    metrics = {
        "test_mse": test_mse,
        "train_mse": train_mse,
        "setting": cfg.setting,
        "method": params.method,
        "parties": len(parts),
        "privacy_unit": params.privacy_unit,
        "noise": cfg.noise,
        "noise_multiplier": params.z,
        "delta": None if params.z is None else params.delta,
        "users": params.n,
        "items": params.m,
    }
    guarantee = "not private" if params.z is None else f"per-{params.privacy_unit} DP"
    headline = (
        f"{cfg.setting.upper()} {params.method} test MSE {test_mse:.4f} ({len(parts)} parties, "
        f"{guarantee})"
    )
    table = pa.table(
        {
            "party": list(parts),
            "sse": [v[0] for v in parts.values()],
            "ratings": [v[1] for v in parts.values()],
        }
    )
    return Outcome(tables={"evaluation": table}, metrics=metrics, headline=headline)
