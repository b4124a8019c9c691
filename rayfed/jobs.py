"""What the scripts in ``jobs/`` share: the common flags, joining Ray, the exit codes, the last line
``RESULT_JSON {...}`` and a few output helpers. A job keeps only what is its own::

    def body(args) -> dict:  # the record printed as RESULT_JSON
        result = rayfed.run("pattern-count", address=args.address, seed=args.seed)
        return {"protocol": result.protocol, "headline": result.headline}

    def main(argv=None) -> int:
        p = jobs.parser(__doc__, small="a quick run", seed=True)
        p.add_argument("--epsilon", type=float, default=1.0)
        return jobs.run("pattern_count", body, p.parse_args(argv))

The scripts import this module from the installed package: ``cluster.yaml`` installs rayfed on
every node, and ``ray job submit --working-dir .`` runs them where it is installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rayfed

ADDRESS_HELP = (
    "Ray address (default: RAY_ADDRESS, else 'auto', falling back to an embedded local Ray)"
)


def parser(
    doc: str, *, small: str, out: str = "runs", seed: bool = False, backend: str | None = None
) -> argparse.ArgumentParser:
    """A job's parser, described by the first paragraph of ``doc``, with the flags every job has:
    ``--small`` (help ``small``), ``--out`` (default ``out``) and ``--address``; ``--seed``
    (default 0) if ``seed``; ``--backend ray|local`` (default ``backend``) if ``backend``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help=small)
    p.add_argument("--out", default=out, help=f"output directory (default: {out})")
    if seed:
        p.add_argument("--seed", type=int, default=0, help="root seed of the run")
    if backend:
        p.add_argument("--backend", default=backend, choices=["ray", "local"])
    p.add_argument("--address", help=ADDRESS_HELP + (" — with --backend ray" if backend else ""))
    return p


def run(name: str, body: Callable[[argparse.Namespace], dict], args: argparse.Namespace) -> int:
    """Run job ``name``: ``body(args)``, then its record as the last line ``RESULT_JSON {...}``.

    Unless ``args.backend`` is "local", Ray is joined first (``rayfed.connect(args.address)``): the
    body sees ``args.address``, the address used (None: an embedded Ray), and ``args.resources``,
    the cluster's; Ray is shut down afterwards if it was not up before. Returns the exit code: 0;
    2 on a configuration error, 1 on any other failure, each with ``name: Type: message`` on stderr
    (and the traceback, unless a RayfedError). A SystemExit (``parser.error``) passes through."""
    joined = False
    try:
        if getattr(args, "backend", "ray") != "local":
            import ray

            joined = not ray.is_initialized()
            args.address, args.resources = rayfed.connect(args.address, name)
        record = body(args)
    except Exception as err:
        if not isinstance(err, rayfed.RayfedError):
            traceback.print_exc(file=sys.stderr)
        print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2 if isinstance(err, rayfed.ConfigError) else 1
    finally:
        if joined:
            rayfed.shutdown()
    print("RESULT_JSON " + json.dumps(record, sort_keys=True), flush=True)
    return 0


def numbers(text: str, cast: Callable[[str], Any] = float) -> list:
    """A comma-separated flag's values: ``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]``."""
    return [cast(v) for v in text.split(",")]


def out_dir(args: argparse.Namespace) -> Path:
    """``--out``, created if missing."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_json(path: Path, record: Any, **dumps: Any) -> Path:
    """``record`` as indented JSON (``dumps``: more options for ``json.dumps``)."""
    path.write_text(json.dumps(record, indent=2, **dumps) + "\n")
    return path


def checks_hold(checks: dict[str, bool]) -> bool:
    """Print one line per reproduction check (``ok`` or ``FAIL``); whether all hold."""
    for check, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {check}")
    return all(checks.values())


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display on a cluster node)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, dpi: int = 100) -> str:
    """Lay out, write and close ``fig``; its path as a string."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return str(path)
