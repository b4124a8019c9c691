"""Resource sizing: cohorts follow the cluster's CPUs; a run that would not fit is refused first."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import rayfed
from rayfed.errors import ConfigError
from rayfed.privacy import PrivacyDeclaration
from rayfed.protocols.base import Plan
from rayfed.sizing import ACTOR_OVERHEAD_BYTES, PARTITION_FACTOR, check_fit, default_cohorts


def plan_with(cohorts: int, rows: int) -> Plan:
    table = pa.table({"v": np.zeros(rows)})
    return Plan(
        privacy=PrivacyDeclaration.none("test"),
        cohorts={f"c{i}": (table, {}) for i in range(cohorts)},
    )


def test_estimate_and_refusal_name_the_numbers():
    plan = plan_with(4, 1_000_000)  # 8 MB per cohort
    need = check_fit(plan, {"memory": 64.0 * 2**30})
    assert need == 5 * ACTOR_OVERHEAD_BYTES + 4 * PARTITION_FACTOR * 8_000_000
    with pytest.raises(ConfigError) as err:
        check_fit(plan, {"memory": 1.0 * 2**30})
    assert err.value.field == "cohorts" and "5 actors" in str(err.value)
    # a declared per-cohort budget replaces the estimate
    assert check_fit(plan, {"memory": 64.0 * 2**30}, cohort_memory_mb=100) == (
        ACTOR_OVERHEAD_BYTES + 4 * (100 << 20)
    )


def test_cohorts_default_to_the_cluster_cpus(ray_cluster):
    assert default_cohorts(10_000, None) == 2  # the test cluster has 2 CPUs
    assert default_cohorts(10_000, 7) == 7 and default_cohorts(3, 8) == 3


def test_a_run_too_large_for_the_cluster_is_refused_before_it_starts(ray_cluster):
    with pytest.raises(ConfigError) as err:
        rayfed.run("square-wave", users=5000, cohorts=2, cohort_memory_mb=10**6, out_dir=None)
    assert err.value.field == "cohorts"
    with pytest.raises(ConfigError) as err:
        rayfed.run("square-wave", users=5000, cohort_memory_mb=0, out_dir=None)
    assert err.value.field == "cohort_memory_mb"


def test_a_refusal_names_the_option_grown_past_its_resolved_default():
    """federated-mf's ``users`` defaults to None (2,500 for LFL, 1,500 for VFL/HFL): an explicit
    users=2500 has not grown, so a run too large because of items=20000 names ``items``."""
    from rayfed.protocols.federated_mf.config import FederatedMFConfig
    from rayfed.sizing import check_data_size, default_size

    cfg = FederatedMFConfig(users=2500, items=20000)
    assert default_size(cfg, "users") == 2500 and default_size(cfg, "items") == 100
    assert default_size(FederatedMFConfig(setting="vfl", users=3000), "users") == 1500
    with pytest.raises(ConfigError) as err:
        check_data_size(2**40, cfg, "this machine", 2**30)
    assert err.value.field == "items" and "items=20,000" in str(err.value)
    # 3x the users beat 2x the items
    with pytest.raises(ConfigError) as err:
        check_data_size(2**40, FederatedMFConfig(users=7500, items=200), "this machine", 2**30)
    assert err.value.field == "users"
