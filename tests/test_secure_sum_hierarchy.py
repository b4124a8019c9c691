"""`secure-sum` with hierarchy=revealed|secure: groups of users, each its own SecAgg+ round, the
group sums combined by the master or by a second secure sum. References are plain numpy sums of
a data file's values, computed without the protocol's code."""

import functools

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed.errors import BelowThreshold, ConfigError
from rayfed.secagg import server as server_steps
from rayfed.secagg.client import add_dealer_masks
from rayfed.secagg.hierarchy import group_rounds, split_groups
from rayfed.secagg.spec import dealer_key, pair_codes, self_codes, sign

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
        assert "does NOT protect the group sums" in hier["server_learned"]  # mode=simulation


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


def _words(values: np.ndarray) -> np.ndarray:
    """The integer sum on the 2^-16 grid (plain numpy), as the ring's signed words show it."""
    return np.rint(values * 2.0**FRAC).astype(np.int64).sum(axis=0)


@pytest.fixture
def received(monkeypatch):
    """Every collect_masked call: (the actor that ran it, its spec, the masked rows it got)."""
    calls = []
    original = server_steps.collect_masked

    @functools.wraps(original)
    def recording(ctx, spec, replies):
        rows = {name: np.asarray(r["y"]).copy() for name, r in replies.items()}
        calls.append((ctx.name, spec, rows))
        return original(ctx, spec, replies)

    monkeypatch.setattr(server_steps, "collect_masked", recording)
    return calls


def _hosts(received) -> list[str]:
    """Each group's aggregator, as observed: the actor that collected group g's masked inputs."""
    return [name for name, spec, _ in received if name != "coordinator"][:G]


def _group_words(values):
    return [_words(values[100 * g : 100 * (g + 1)]) for g in range(G)]


def test_revealed_sends_every_group_round_to_the_master_and_says_so(data, received):
    _, _, values = data
    result = _run(data, "revealed", mode="plain")
    at_master = [(spec, rows) for name, spec, rows in received if name == "coordinator"]
    assert len(at_master) == len(received) == G  # every group's round reached the master
    for g, (spec, rows) in enumerate(at_master):  # plain: the rows add up to the group's sum
        words = spec.encoding.reduce(sum(r.sum(axis=0, dtype=np.uint64) for r in rows.values()))
        assert np.array_equal(spec.encoding.signed(words), _group_words(values)[g])
    assert f"learns each of the {G} groups' sums" in result.privacy.statement


def test_secure_variant_the_master_receives_no_group_sum_in_mode_secure(data, received):
    """What the coordinator RECEIVED: only the second sum's masked rows, one per aggregator, none
    of them a group's sum; the groups' rounds were collected by the aggregators."""
    _, _, values = data
    result = _run(data, "secure", mode="secure")
    assert result.metrics["exact"]
    at_master = [(spec, rows) for name, spec, rows in received if name == "coordinator"]
    assert len(at_master) == 1 and len(received) == G + 1
    spec, rows = at_master[0]
    assert spec.registry.tolist() == list(range(G))  # the aggregators' sum
    hosts = _hosts(received)
    assert sorted(rows) == sorted(hosts)
    sums = _group_words(values)
    for y in rows.values():
        got = spec.encoding.signed(spec.encoding.reduce(y.sum(axis=0, dtype=np.uint64)))
        assert not any(np.array_equal(got, w) for w in sums)
    assert "only the total" in result.privacy.statement
    assert "NOT protect" not in result.privacy.statement


def test_secure_variant_in_dealer_mode_the_master_can_read_every_group_sum(data, received):
    """mode=dealer: the master, from what it received and the dealer key it holds, recovers each
    group's sum; so the statement must not claim it learns only the total."""
    _, _, values = data
    result = _run(data, "secure", mode="dealer", seed=4)
    ((spec, rows),) = [(sp, r) for name, sp, r in received if name == "coordinator"]
    hosts = _hosts(received)
    key = dealer_key(4, spec.round)
    sums = _group_words(values)
    for g, host in enumerate(hosts):  # aggregator g is position g of the complete graph
        mask = np.zeros((1, spec.dim), spec.word_dtype)
        pos = np.array([g])
        others = np.array([[v for v in range(G) if v != g]])
        add_dealer_masks(key, spec, self_codes(pos)[:, None], np.ones((1, 1), np.int8), mask)
        add_dealer_masks(
            key, spec, pair_codes(pos[:, None], others, G), sign(pos[:, None], others), mask
        )
        y = rows[host].sum(axis=0, dtype=np.uint64)
        words = spec.encoding.reduce(y - mask[0].astype(np.uint64))
        assert np.array_equal(spec.encoding.signed(words), sums[g])
    text = result.privacy.statement
    assert (
        "does NOT protect the group sums from the master" in text and "only the total" not in text
    )


def test_secure_variant_refuses_mode_plain():
    """mode=plain would send every aggregator's group sum unmasked to the master."""
    with pytest.raises(ConfigError) as err:
        rayfed.run(
            "secure-sum", backend="local", out_dir=None, users=90, cohorts=3,
            hierarchy="secure", groups=2, mode="plain",
        )  # fmt: skip
    assert err.value.field == "hierarchy"


def test_server_shards_with_a_hierarchy_is_refused():
    """The group rounds are served by the coordinator and the aggregators: shards would start and
    never be asked anything."""
    with pytest.raises(ConfigError) as err:
        rayfed.run(
            "secure-sum", backend="local", out_dir=None, users=90, cohorts=3,
            hierarchy="revealed", groups=2, server_shards=2,
        )  # fmt: skip
    assert err.value.field == "server_shards"


def test_the_transcript_addresses_group_rounds_to_their_aggregator(data, received):
    """Secure variant: a group's messages go to its aggregator, its aggregator's broadcasts only to
    the group's members, and no masked input of a group reaches the coordinator."""
    result = _run(data, "secure")
    hosts = _hosts(received)
    rows = result.transcript.to_pylist()
    # cohort c holds positions 75c..75c+74 (4 cohorts over 300 users), group g 100g..100g+99
    members = [{f"c{c}" for c in range(4) if 75 * c < 100 * (g + 1) and 100 * g < 75 * (c + 1)}
               for g in range(G)]  # fmt: skip
    for g, host in enumerate(hosts):
        inputs = [r for r in rows if r["name"] == "masked_input" and r["receiver"] == host]
        assert {r["sender"] for r in inputs} == members[g] - {host} == members[g]
        out = [
            r for r in rows if r["sender"] == host and r["name"] in ("key_table", "unmask_request")
        ]
        assert out and {r["receiver"] for r in out} == members[g]
    to_master = [r for r in rows if r["name"] == "masked_input" and r["receiver"] == "coordinator"]
    assert sorted(r["sender"] for r in to_master) == sorted(hosts)  # the second sum's only


def test_group_rounds_stream_their_users_and_stay_addressed_to_their_aggregator(
    data, received, monkeypatch
):
    """A group round streams a by_user input in chunks, as a flat round does (memory does not grow
    with the group's n·d), and the streamed masked input still goes to the group's aggregator."""
    from rayfed.protocols.secure_sum import driver
    from rayfed.secagg import client

    monkeypatch.setattr(client, "_CHUNK_ROWS", 7)
    sizes = []
    original = driver.table_inputs

    @client.by_user
    def counting(ctx, round, ids, *args):
        sizes.append(len(ids))
        return original(ctx, round, ids, *args)

    monkeypatch.setattr(driver, "table_inputs", counting)
    test_the_transcript_addresses_group_rounds_to_their_aggregator(data, received)
    assert sizes and max(sizes) <= 7


def test_each_aggregator_sits_on_a_cohort_of_its_own_holding_none_of_its_users(data, received):
    result = _run(data, "secure")
    hosts = _hosts(received)  # where each group's round was collected
    assert len(set(hosts)) == G
    for g, host in enumerate(hosts):
        c = int(host[1:])  # cohort c holds positions 75c..75c+74
        assert not (75 * c < 100 * (g + 1) and 100 * g < 75 * (c + 1))
        assert f"group {g} on {host}" in result.privacy.statement
    assert "collude with no one" in result.privacy.statement
    assert result.metrics["hierarchy"]["aggregator_hosts"] == hosts
    with pytest.raises(ConfigError) as err:  # 4 groups over 3 cohorts: no distinct hosts
        _run(data, "secure", cohorts=3, groups=4)
    assert err.value.field == "groups" and "more cohorts" in str(err.value)


@pytest.mark.parametrize("variant", ["revealed", "secure"])
def test_an_outage_hits_the_protocol_round_as_in_a_flat_run(variant):
    kw = dict(
        backend="local", out_dir=None, seed=3, users=90, dim=3, cohorts=3, rounds=2,
        population={"outage": list(range(30, 40)), "outage_start": 1},
    )  # fmt: skip
    flat = rayfed.run("secure-sum", **kw)
    hier = rayfed.run("secure-sum", hierarchy=variant, groups=2, **kw)
    assert [r["survivors"] for r in flat.metrics["rounds"]] == [90, 80]
    assert [r["survivors"] for r in hier.metrics["rounds"]] == [90, 80]
    assert hier.metrics["exact"]
    assert hier.tables["sums"].column("secure_sum").equals(flat.tables["sums"].column("secure_sum"))


def test_a_secure_mode_abort_is_predicted_not_taken_as_given(data):
    """mode=secure: group 1 below its quorum at advertise is expected to abort (from the drop
    codes alone); a group that aborts though its users all answered reads NOT EXACT."""
    import dataclasses

    from rayfed.protocols.secure_sum import report

    _, ids, values = data
    gone = ids[100:145]
    result = _run(data, "secure", mode="secure", population={"lost": {"advertise": gone.tolist()}})
    (row,) = result.metrics["rounds"]
    assert row["exact"] and row["groups_dropped"] == "1" and row["survivors"] == 200
    want = _sum(np.concatenate([values[:100], values[200:]]))
    assert np.array_equal(result.tables["sum"]["secure_sum"].to_numpy(), want)
    # the check itself: group 0 reported aborted (at masked_input) though all its users answered
    from rayfed.protocols.secure_sum.config import SecureSumConfig
    from rayfed.protocols.secure_sum.plan import plan as make_plan
    from rayfed.secagg import make_spec
    from rayfed.secagg.hierarchy import HierarchyResult

    cfg = SecureSumConfig(users=90, dim=2, cohorts=3, hierarchy="secure", groups=2, mode="secure")
    plan = make_plan(cfg, 5)
    p = plan.params
    specs = [
        make_spec(round=g, mode="secure", registry=reg, params=p.group_secagg[g],
                  encoding=p.encoding, dim=2, dropout=p.schedule)
        for g, reg in enumerate(p.group_registries)
    ]  # fmt: skip
    fake = HierarchyResult(
        "secure", np.zeros(2), np.zeros(2, np.uint64), list(p.group_registries), [None, 45],
        [0], [None, None],
    )  # fmt: skip
    fake.abort_phases = ["masked_input", None]
    check = report.group_references(cfg, plan, specs, fake, seed=5, round=0)
    assert check["expected_dropped"] == []  # nothing in the drop codes makes group 0 abort
    at_unmask = dataclasses.replace(fake, abort_phases=["unmask", None])
    check = report.group_references(cfg, plan, specs, at_unmask, seed=5, round=0)
    assert check["expected_dropped"] == [0]  # an unmask-phase abort: taken as given (stated)


def test_fail_with_a_hierarchy_is_refused():
    with pytest.raises(ConfigError) as err:
        rayfed.run(
            "secure-sum", backend="local", out_dir=None, users=90, cohorts=3,
            hierarchy="revealed", groups=2, fail=["cohort=c1@phase=masked_input"],
        )  # fmt: skip
    assert err.value.field == "fail"


def test_two_groups_state_the_second_sums_threshold_of_one(data):
    result = _run(data, "secure", mode="secure", groups=2)
    assert result.metrics["exact"]
    assert "threshold is t = 1" in result.privacy.statement
    assert "threshold is t = 1" not in _run(data, "secure", mode="secure").privacy.statement
