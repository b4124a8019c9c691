"""The documentation stays true: every ``rayfed run`` command in README.md and docs/ is parsed
and validated against the protocol's options (without running it), and the worked example of
docs/adding-a-protocol.md is built from the page and run."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

import rayfed
from rayfed.api import resolve
from rayfed.cli import _run_parser, run_options
from rayfed.errors import ConfigError
from rayfed.protocols import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`(rayfed run [^`]+)`")


def run_commands(text: str) -> list[str]:
    """Every ``rayfed run ...`` of a page: in code blocks (continuation lines joined, comments
    dropped) and in inline code."""
    found = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()
            at = line.find("rayfed run ")
            if at >= 0:
                found.append(line[at:])
    return found + INLINE.findall(text)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The noisy-sum package of docs/adding-a-protocol.md, written out and registered."""
    page = (ROOT / "docs" / "adding-a-protocol.md").read_text()
    root = tmp_path_factory.mktemp("example")
    package = root / "noisy_sum"
    package.mkdir()
    blocks = [b for b in FENCE.findall(page) if b.startswith("# noisy_sum/")]
    assert len(blocks) == 7
    for block in blocks:
        first, _, body = block.partition("\n")
        (package / first.removeprefix("# noisy_sum/")).write_text(body)
    sys.path.insert(0, str(root))
    REGISTRY["noisy-sum"] = ("noisy_sum", "NoisySum")
    yield "noisy-sum"
    del REGISTRY["noisy-sum"]
    sys.path.remove(str(root))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_rayfed_run_command_is_valid(page, example, tmp_path):
    stand_in = tmp_path / "data.csv"  # for data files the page names but this machine lacks
    stand_in.write_text("id,value\n1,0.5\n")
    checked = 0
    for command in run_commands(page.read_text()):
        words = shlex.split(command)[2:]
        if not words or words[0] in ("PROTOCOL", "..."):  # a syntax line, not a command
            continue
        assert words[0] in REGISTRY, f"{page.name}: unknown protocol in {command!r}"
        args = _run_parser().parse_args(words)
        sets = [_existing(s, stand_in) for s in args.set]
        try:
            proto, run_opts, cfg = resolve(args.protocol, args.config, sets, **run_options(args))
            proto.resolve_randomness(cfg, run_opts.randomness)
        except ConfigError as err:
            pytest.fail(f"{page.name}: {command!r} is not a valid run: {err}")
        checked += 1
    if page.name == "README.md":
        assert checked >= 2


#: options that name a file (checked to exist when the config is read)
FILE_OPTIONS = ("data.path", "population.trace")


def _existing(assignment: str, stand_in: Path) -> str:
    key, _, value = assignment.partition("=")
    if key in FILE_OPTIONS and not (ROOT / value).exists() and not Path(value).exists():
        return f"{key}={stand_in}"
    return assignment


def test_the_worked_example_runs_and_keeps_its_promises(example):
    result = rayfed.run(example, backend="local", out_dir=None, users=5000)
    assert result.privacy.epsilon == pytest.approx(1.0) and result.privacy.composition == "parallel"
    assert abs(result.metrics["error"]) < 5 * 4.0  # two parties' Lap(2): variance 2·2·2², sd 4
    again = rayfed.run(example, backend="local", out_dir=None, users=5000)
    assert again.tables["total"].equals(result.tables["total"])
    secure = rayfed.run(example, backend="local", out_dir=None, users=5000, randomness="secure")
    assert not secure.tables["total"].equals(result.tables["total"])
    with pytest.raises(ConfigError) as err:
        rayfed.run(example, backend="local", out_dir=None, column="x")  # a file option, no file
    assert err.value.field == "column"


def test_the_worked_example_passes_the_sensitivity_check_in_both_modes(example):
    """The conformance suite's empirical sensitivity check on the page's protocol: its local
    Laplace and its central Gaussian move by at most their derived Δ (2·clip)."""
    sys.path.insert(0, str(ROOT / "tests" / "conformance"))
    from test_sensitivity import check

    for options in get_examples(example):
        assert not check(example, options)


def get_examples(name):
    from rayfed.protocols import get_protocol

    return get_protocol(name).examples


def test_the_worked_examples_central_release_is_calibrated_with_the_tightest_accountant(example):
    central = rayfed.run(example, backend="local", out_dir=None, users=2000, mode="central")
    p = central.privacy
    assert p.accountant == "tightest" and p.accountant_used == "pld"
    assert 0.99 < p.epsilon <= 1.0 < p.epsilon_by_accountant["rdp"]
    assert p.releases == [
        "Gaussian on the total: Gaussian, noise multiplier z = "
        f"{central.privacy.entries[0]['noise_multiplier']:.4g}, Δ2 = 2 "
        "(one user's value replaced, [-1, 1])"
    ]


def test_the_worked_example_refuses_or_counts_values_outside_its_domain(example, tmp_path):
    data = tmp_path / "values.csv"
    data.write_text("value\n" + "\n".join(["0.5", "3.0", "-2.0", "0.1"]) + "\n")
    with pytest.raises(ConfigError) as err:
        rayfed.run(example, backend="local", out_dir=None, sets=[f"data.path={data}"])
    assert err.value.field == "data.column" and "2 of 4 values" in str(err.value)
    clipped = rayfed.run(
        example, backend="local", out_dir=None, sets=[f"data.path={data}", "out_of_domain=clip"]
    )
    assert "2 of 4 data.column values clipped to [-1, 1]" in clipped.headline
    assert clipped.tables["total"].column("true_sum")[0].as_py() == pytest.approx(0.6)
