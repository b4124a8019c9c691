"""Placement on a multi-node Ray cluster (ray.cluster_utils.Cluster: 3 nodes on this machine, in a
subprocess so the session's own Ray is untouched): one party per node through a node resource,
cohorts spread, and the same results as in-process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rayfed
from rayfed.api import actor_placement
from rayfed.config import RunOptions
from rayfed.errors import ConfigError

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from ray.cluster_utils import Cluster
    import rayfed

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"party_slot": 1}},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=2, resources={"party_slot": 1})
    cluster.wait_for_nodes()
    rayfed.ensure_ray(address=cluster.address)
    out = sys.argv[1]
    kmeans = rayfed.run(
        "hfl-kmeans", clients=3, users=900, k=3, party_resource="party_slot", out_dir=out
    )
    secure = rayfed.run("secure-sum", users=90, cohorts=3, dim=4, out_dir=out)
    manifests = [
        json.load(open(f"{r.run_dir}/manifest.json")) for r in (kmeans, secure)
    ]
    print("RESULT_JSON " + json.dumps({
        "nodes": len(cluster.list_all_nodes()),
        "kmeans_placement": manifests[0]["placement"],
        "secure_placement": manifests[1]["placement"],
        "centroids": kmeans.tables["centroids"].to_pydict(),
        "secure_sum": [float(v) for v in secure.tables["sum"].column(0).to_pylist()]
            if "sum" in secure.tables else None,
        "secure_headline": secure.headline,
    }))
    rayfed.shutdown()
    cluster.shutdown()
    """
)


@pytest.mark.slow
@pytest.mark.ray
def test_three_node_cluster_places_one_party_per_node_with_the_same_result(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT_JSON "))
    got = json.loads(line.removeprefix("RESULT_JSON "))
    assert got["nodes"] == 3
    party_nodes = [got["kmeans_placement"][p] for p in ("p0", "p1", "p2")]
    assert len(set(party_nodes)) == 3  # one party per node
    local = rayfed.run("hfl-kmeans", clients=3, users=900, k=3, backend="local", out_dir=None)
    expected = local.tables["centroids"].to_pydict()
    for column, values in expected.items():
        np.testing.assert_array_equal(got["centroids"][column], values)
    local_secure = rayfed.run(
        "secure-sum", users=90, cohorts=3, dim=4, backend="local", out_dir=None
    )
    assert got["secure_headline"] == local_secure.headline
    cohort_nodes = {got["secure_placement"][c] for c in ("c0", "c1", "c2")}
    assert len(cohort_nodes) >= 2  # SPREAD is best effort, but three idle nodes take them apart


def test_party_resource_is_checked_before_any_actor_starts():
    opts = RunOptions(party_resource="party_slot")
    with pytest.raises(ConfigError) as err:
        actor_placement(opts, parties=3, resources={"CPU": 2.0, "party_slot": 2.0})
    assert err.value.field == "party_resource" and "2 of resource" in str(err.value)
    placed = actor_placement(opts, parties=2, resources={"party_slot": 2.0})
    assert placed["party"] == {"scheduling_strategy": "SPREAD", "resources": {"party_slot": 1.0}}
    assert placed["cohort"] == {"scheduling_strategy": "SPREAD"}
    assert actor_placement(RunOptions(spread=False), 2, {}) == {"party": {}, "cohort": {}}
