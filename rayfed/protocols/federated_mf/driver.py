"""The rounds of ``federated-mf``: the chosen setting's driver, or the central baseline."""

from __future__ import annotations

from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.federated_mf import report
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl import driver as lfl_driver
from rayfed.protocols.federated_mf.lfl import report as lfl_report
from rayfed.protocols.federated_mf.partitioned import driver as partitioned_driver
from rayfed.protocols.federated_mf.steps import central_test_mse


def drive(fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
    if plan.params.method == "central":
        return _central(fed, cfg, plan)
    if cfg.setting == "lfl":
        return lfl_driver.drive(fed, cfg, plan)
    return partitioned_driver.drive(fed, cfg, plan)


def _central(fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
    """The non-private central baseline, trained in the driver on the pooled ratings: no member
    runs a step and nothing is released."""
    test_mse = central_test_mse(plan.evaluation, rank=cfg.rank, seed=fed.seed)
    fed.note(report.CENTRAL_NOTE)
    if cfg.setting == "lfl":
        return lfl_report.outcome(cfg, plan.params, plan.privacy.budget.epsilon, test_mse, [], {})
    return report.central_outcome(cfg, test_mse, plan.params.clipped)
