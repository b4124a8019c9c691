"""What the central baseline of ``federated-mf`` reports; each setting's own report is in
``lfl.report`` and ``partitioned.report``."""

from __future__ import annotations

from rayfed.privacy import Clipped
from rayfed.protocols.base import Outcome
from rayfed.protocols.federated_mf.config import FederatedMFConfig

CENTRAL_NOTE = "central non-private baseline: no privacy; trained on the pooled ratings"


def central_outcome(cfg: FederatedMFConfig, test_mse: float, clipped: Clipped | None) -> Outcome:
    """The central baseline of the VFL/HFL settings: its test MSE only (LFL's reports its own
    metrics, with no iterations)."""
    metrics = {"test_mse": test_mse, "setting": cfg.setting, "method": "central"}
    headline = f"central non-private SGD test MSE {test_mse:.4f}"
    if clipped is not None:
        metrics["clipped"] = clipped.to_dict()
        if clipped.count:
            headline += f"; {clipped.statement()}"
    return Outcome(tables={}, metrics=metrics, headline=headline)
