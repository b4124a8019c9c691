"""rayfed.jobs, the scaffolding of the job scripts: flags, exit codes, the RESULT_JSON line and
joining Ray (stubbed here: no Ray starts)."""

from __future__ import annotations

import argparse
import json

import pytest

import rayfed
from rayfed import jobs


def local(**extra) -> argparse.Namespace:
    return argparse.Namespace(backend="local", address=None, **extra)


def test_success_prints_the_record_last_with_sorted_keys(capsys):
    def body(args):
        print("summary")
        return {"b": 2, "a": [1.5, None]}

    assert jobs.run("demo", body, local()) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["summary", 'RESULT_JSON {"a": [1.5, null], "b": 2}']
    assert json.loads(out[-1].removeprefix("RESULT_JSON ")) == {"a": [1.5, None], "b": 2}


@pytest.mark.parametrize(
    "error, code, traceback",
    [
        (rayfed.ConfigError("users", "must be >= 1, got 0"), 2, False),
        (rayfed.errors.DataError("path", "no such file"), 2, False),
        (rayfed.RayfedError("a party died"), 1, False),
        (ValueError("a bug"), 1, True),
    ],
)
def test_failures_exit_code_message_and_traceback(capsys, error, code, traceback):
    def body(args):
        raise error

    assert jobs.run("demo", body, local()) == code
    out, err = capsys.readouterr()
    assert "RESULT_JSON" not in out
    assert err.splitlines()[-1] == f"demo: {type(error).__name__}: {error}"
    assert ("Traceback (most recent call last)" in err) is traceback


def test_system_exit_passes_through(capsys):
    def body(args):
        raise SystemExit("bad --grid")

    with pytest.raises(SystemExit, match="bad --grid"):
        jobs.run("demo", body, local())
    assert capsys.readouterr().err == ""


@pytest.fixture
def fake_ray(monkeypatch):
    """rayfed.connect and rayfed.shutdown stubbed; Ray reported as not running."""
    import ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(
        rayfed,
        "connect",
        lambda address, who: calls.append(("connect", address, who)) or (None, {"CPU": 2.0}),
    )
    monkeypatch.setattr(rayfed, "shutdown", lambda: calls.append(("shutdown",)))
    return calls


@pytest.mark.parametrize("fails", [False, True])
def test_ray_backend_joins_ray_first_and_shuts_it_down(fake_ray, capsys, fails):
    seen = {}

    def body(args):
        seen.update(address=args.address, resources=args.resources, calls=list(fake_ray))
        if fails:
            raise rayfed.RayfedError("lost")
        return {}

    args = argparse.Namespace(backend="ray", address="host:6379")
    assert jobs.run("demo", body, args) == (1 if fails else 0)
    assert seen == {
        "address": None,
        "resources": {"CPU": 2.0},
        "calls": [("connect", "host:6379", "demo")],
    }
    assert fake_ray[-1] == ("shutdown",)


def test_no_backend_flag_means_ray_and_local_backend_never_touches_ray(fake_ray):
    assert jobs.run("demo", lambda args: {}, argparse.Namespace(address=None)) == 0
    assert [c[0] for c in fake_ray] == ["connect", "shutdown"]
    fake_ray.clear()
    assert jobs.run("demo", lambda args: {}, local()) == 0
    assert fake_ray == []


def test_parser_common_flags():
    p = jobs.parser("A job.\n\nMore.", small="quick", out="runs/x")
    args = p.parse_args([])
    assert p.description == "A job."
    assert vars(args) == {"small": False, "out": "runs/x", "address": None}
    p = jobs.parser("A job.", small="quick", seed=True, backend="local")
    args = p.parse_args(["--small", "--seed", "3", "--address", "auto"])
    assert (args.small, args.seed, args.backend, args.address) == (True, 3, "local", "auto")
    with pytest.raises(SystemExit):
        p.parse_args(["--backend", "spark"])


def test_output_helpers(tmp_path, capsys):
    assert jobs.numbers("0.5,1,4") == [0.5, 1.0, 4.0] and jobs.numbers("2,8", int) == [2, 8]
    out = jobs.out_dir(argparse.Namespace(out=str(tmp_path / "a" / "b")))
    assert out.is_dir()
    path = jobs.write_json(out / "r.json", {"x": out}, default=str)
    assert json.loads(path.read_text()) == {"x": str(out)}
    assert jobs.checks_hold({"one": True, "two": False}) is False
    assert capsys.readouterr().out == "ok   one\nFAIL two\n"
    fig, ax = jobs.pyplot().subplots()
    ax.plot([0, 1], [1, 0])
    saved = jobs.save(fig, out / "p.png", dpi=50)
    assert saved == str(out / "p.png") and (out / "p.png").stat().st_size > 0
