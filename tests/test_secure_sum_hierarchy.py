"""`secure-sum` with hierarchy=revealed|secure: groups of users, each its own SecAgg+ round, the
group sums combined by the master or by a second secure sum. References are plain numpy sums of
a data file's values, computed without the protocol's code."""

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed.errors import BelowThreshold, ConfigError
from rayfed.protocols.secure_sum.config import SecureSumConfig
from rayfed.protocols.secure_sum.report import statement
from rayfed.secagg.hierarchy import group_rounds, server_learns, split_groups

N, DIM, G = 300, 3, 3
FRAC = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """300 users with non-contiguous ids, three value columns in [-1, 1]."""
    gen = np.random.default_rng(11)
    ids = np.arange(N, dtype=np.int64) * 3 + 5
    values = gen.uniform(-1, 1, size=(N, DIM))
    path = tmp_path_factory.mktemp("hier") / "v.csv"
    cols = {"uid": ids, **{f"x{j}": values[:, j] for j in range(DIM)}}
    pacsv.write_csv(pa.table(cols), path)
    return str(path), ids, values


def _sum(values: np.ndarray) -> np.ndarray:
    """The fixed-point sum on the 2^-16 grid, by plain numpy (exact in float64 at this size)."""
    return np.rint(values * 2.0**FRAC).astype(np.int64).sum(axis=0) / 2.0**FRAC


def _run(data, variant, **kw):
    path, _, _ = data
    opts = dict(
        backend="local",
        out_dir=None,
        seed=4,
        cohorts=4,  # 4 cohorts over 3 groups: a cohort holds users of two groups
        data={"path": path, "key": "uid"},
        hierarchy=variant,
        groups=G,
        mode="simulation",
    )
    return rayfed.run("secure-sum", **{**opts, **kw})


@pytest.mark.parametrize("variant", ["revealed", "secure"])
def test_total_is_the_sum_over_survivors_and_only_revealed_shows_group_sums(data, variant):
    _, ids, values = data
    lost = ids[[3, 150, 299]]  # one user of each group lost before its masked input
    result = _run(data, variant, population={"lost": {"masked_input": lost.tolist()}})
    keep = ~np.isin(ids, lost)
    got = result.tables["sum"]["secure_sum"].to_numpy()
    assert np.array_equal(got, _sum(values[keep]))
    (row,) = result.metrics["rounds"]
    assert row["exact"] and row["survivors"] == N - 3 and row["group_survivors"] == "99,99,99"
    hier = result.metrics["hierarchy"]
    assert hier["variant"] == variant and hier["group_sizes"] == [100, 100, 100]
    if variant == "revealed":
        table = result.tables["group_sums"]
        for g in range(G):
            rows = slice(100 * g, 100 * (g + 1))  # contiguous by position in the sorted registry
            mine = table.filter(pa.compute.equal(table["group"], g))["sum"].to_numpy()
            assert np.array_equal(mine, _sum(values[rows][keep[rows]]))
    else:
        assert "group_sums" not in result.tables
        assert "only the total" in hier["server_learned"]


def test_a_group_below_its_threshold_is_dropped_and_the_total_misses_it(data):
    _, ids, values = data
    gone = ids[100:145]  # 45 of group 1's 100 users before advertise: its quorum is 70
    for variant in ("revealed", "secure"):
        result = _run(data, variant, population={"lost": {"advertise": gone.tolist()}})
        (row,) = result.metrics["rounds"]
        assert row["exact"] and row["groups_dropped"] == "1" and row["survivors"] == 200
        assert result.metrics["hierarchy"]["groups_dropped"] == [1]
        want = _sum(np.concatenate([values[:100], values[200:]]))
        assert np.array_equal(result.tables["sum"]["secure_sum"].to_numpy(), want)
        assert "group(s) 1 fell below" in result.headline and "misses" in result.headline
    with pytest.raises(BelowThreshold):  # every group below its threshold: the round aborts
        _run(data, "secure", population={"rates": {"advertise": 0.5}})


def test_both_variants_and_dealer_mode_agree_with_the_flat_sum(data):
    """Plain flat run, both variants, two rounds, dealer mode: the same totals."""
    path, _, values = data
    flat = rayfed.run(
        "secure-sum", backend="local", out_dir=None, seed=4, data={"path": path, "key": "uid"}
    )
    for variant in ("revealed", "secure"):
        result = _run(data, variant, mode="dealer", rounds=2)
        assert result.metrics["exact"] and len(result.metrics["rounds"]) == 2
        assert result.tables["sum"]["secure_sum"].equals(flat.tables["sum"]["secure_sum"])
    assert np.array_equal(flat.tables["sum"]["secure_sum"].to_numpy(), _sum(values))


def test_the_statement_follows_the_variant():
    revealed = SecureSumConfig(users=300, hierarchy="revealed", groups=3)
    secure = dataclasses.replace(revealed, hierarchy="secure")
    assert statement(revealed) != statement(secure)
    assert "each of the 3 groups' sums" in statement(revealed)
    assert "each of the 3 groups' sums" not in statement(secure)
    assert "only the total" in statement(secure) and "only the total" not in statement(revealed)
    assert "hierarch" not in statement(dataclasses.replace(revealed, hierarchy="none", groups=None))
    assert "group(s) 2 fell below" in server_learns("secure", 3, dropped=[2])


def test_groups_are_contiguous_and_never_share_a_round():
    parts = split_groups(np.arange(10) * 7, 3)
    assert [p.size for p in parts] == [4, 3, 3]
    assert np.array_equal(np.concatenate(parts), np.arange(10) * 7)
    numbers = [n for r in range(3) for n in (lambda g, t: [*g, t])(*group_rounds(r, 4))]
    assert len(set(numbers)) == len(numbers)  # salts, dealer keys and masks all differ


@pytest.mark.parametrize(
    "options, field",
    [
        (dict(groups=3), "groups"),
        (dict(hierarchy="secure"), "groups"),
        (dict(hierarchy="secure", groups=200), "groups"),
        (dict(hierarchy="revealed", groups=75), "groups"),  # 4 users a group: no threshold
        (dict(hierarchy="secure", groups=3, dp_mechanism="skellam", epsilon=1), "hierarchy"),
        (dict(hierarchy="secure", groups=3, threat_model="malicious"), "hierarchy"),
        (dict(hierarchy="secure", groups=3, degree=10), "degree"),
    ],
)
def test_bad_hierarchy_options_name_the_option(options, field):
    with pytest.raises(ConfigError) as err:
        rayfed.run("secure-sum", backend="local", out_dir=None, users=300, **options)
    assert err.value.field == field


@pytest.mark.ray
def test_secure_variant_on_ray_equals_local(ray_cluster):
    kw = dict(users=90, dim=4, seed=2, out_dir=None, hierarchy="secure", groups=2, cohorts=3)
    on_ray = rayfed.run("secure-sum", **kw)
    local = rayfed.run("secure-sum", backend="local", **kw)
    assert on_ray.metrics["exact"] and local.metrics["exact"]
    assert on_ray.tables["sum"].equals(local.tables["sum"])
    assert on_ray.metrics["rounds"] == local.metrics["rounds"]


def test_secure_variant_keeps_group_sums_off_the_driver_and_the_master():
    """The library call: in ``secure`` no group's sum, words or survivor set comes back from its
    aggregator; the total is the numpy sum of every user's input (no dropout)."""
    from rayfed import rng
    from rayfed.data import per_user
    from rayfed.federation import Federation
    from rayfed.privacy import PrivacyDeclaration
    from rayfed.protocols.secure_sum.driver import _on
    from rayfed.secagg import FixedPoint, find_params, make_spec
    from rayfed.secagg.hierarchy import hierarchical_sum

    def inputs(ctx, round, ids, dim):
        return rng.keyed_uniform(ctx.seed, "h", round, ids, dim) * 2 - 1

    ids = np.arange(120, dtype=np.int64) * 5 + 2
    cohorts = {k: (t, {}) for k, t in per_user(pa.table({"uid": ids}), "uid", 3).items()}
    users = {k: t.column("user_id").to_numpy() for k, (t, _) in cohorts.items()}
    enc = FixedPoint.choose(ids.size, 1.0, 12)
    groups = split_groups(ids, 3)
    numbers, top = group_rounds(0, 3)

    def spec(r, reg, params):
        return make_spec(
            round=r, mode="simulation", registry=reg, params=params, encoding=enc, dim=2
        )

    specs = [
        spec(numbers[g], reg, find_params(reg.size, dropout=0.3)) for g, reg in enumerate(groups)
    ]
    top_spec = spec(top, np.arange(3), find_params(3, dropout=0.0, corrupt=0.0, graph="complete"))
    with Federation(
        run_id="h", seed=9, cohorts=cohorts, privacy=PrivacyDeclaration.none("t"), backend="local"
    ) as fed:
        hosts = [fed.cohorts.names[g % 3] for g in range(3)]
        result = hierarchical_sum(
            fed.cohorts, users, specs, inputs, (2,), round=0, variant="secure",
            master=fed.coordinator, aggregators=[_on(fed, h) for h in hosts],
            aggregator_members=_on(fed, *hosts), aggregator_hosts=hosts, top_spec=top_spec,
        )  # fmt: skip
    assert result.group_sums is None and result.survivors is None
    for r in result.group_results:
        assert r.sum is None and r.words is None and r.survivors is None
    assert result.group_counts == [40, 40, 40] and result.top.survivors.tolist() == [0, 1, 2]
    x = rng.keyed_uniform(9, "h", 0, ids, 2) * 2 - 1
    want = np.rint(x * 2.0**12).astype(np.int64).sum(axis=0)
    assert np.array_equal(enc.signed(result.words), want)
