"""The ``rayfed`` command. Thin: parses arguments, then calls the API.

rayfed list
rayfed run PROTOCOL [--config FILE.yaml] [--set key=value ...] [--seed N] [--address ADDR]
                    [--out DIR] [--backend ray|local] [--quiet] [--fail SPEC ...]
rayfed run PROTOCOL --help
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

from rayfed.config import RunOptions, describe
from rayfed.errors import ConfigError, Interrupted, RayfedError
from rayfed.protocols import REGISTRY, get_protocol
from rayfed.protocols.base import loss_lines


def _cmd_list(_args) -> int:
    width = max(len(n) for n in REGISTRY)
    for name in sorted(REGISTRY):
        print(f"{name:<{width}}  {get_protocol(name).summary}")
    return 0


def protocol_help(name: str) -> str:
    proto = get_protocol(name)
    lines = [
        f"rayfed run {name} [--config FILE.yaml] [--set key=value ...] [--seed N] [--address ADDR] [--out DIR] "
        "[--backend ray|local] [--quiet] [--fail SPEC ...]",
        "",
        proto.summary,
        "",
        "Protocol options (--set key=value, or keys of the YAML file):",
    ]
    rows = describe(proto.Config)
    run_rows = describe(RunOptions)
    width = max(len(r[0]) for r in rows + run_rows)
    for title, table in (("", rows), ("Run options (same for every protocol):", run_rows)):
        if title:
            lines += ["", title]
        for key, tp, default, text in table:
            wrapped = textwrap.wrap(f"{text} [{tp}; default {default}]", 100 - width - 4) or [""]
            lines.append(f"  {key:<{width}}  {wrapped[0]}")
            lines += [f"  {'':<{width}}  {w}" for w in wrapped[1:]]
    return "\n".join(lines)


def _cmd_run(args) -> int:
    if args.protocol is None:
        print(_run_parser().format_help())
        return 0 if args.help else 2
    if args.help:
        print(protocol_help(args.protocol))
        return 0
    from rayfed.api import run

    result = run(
        args.protocol, args.config, sets=args.set, progress=not args.quiet, **run_options(args)
    )
    print(result.summary())
    return 0


def run_options(args) -> dict:
    """The run options a parsed ``rayfed run`` command line gives as keywords."""
    given = (
        ("seed", args.seed),
        ("address", args.address),
        ("out_dir", args.out),
        ("backend", args.backend),
        ("fail", args.fail),
    )
    return {k: v for k, v in given if v is not None}


def _run_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="rayfed run", add_help=False)
    p.add_argument("protocol", nargs="?", help="protocol name (see `rayfed list`)")
    p.add_argument(
        "-h", "--help", action="store_true", help="show the protocol's options and defaults"
    )
    p.add_argument("--config", help="YAML file of options")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one option (repeatable)",
    )
    p.add_argument("--seed", type=int, help="root seed of the run")
    p.add_argument(
        "--address", help="Ray cluster address (default: RAY_ADDRESS, else embedded local Ray)"
    )
    p.add_argument("--out", help="directory for run directories (default: runs)")
    p.add_argument(
        "--backend", choices=["ray", "local"], help="ray (default) or local (in-process, no Ray)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--fail",
        action="append",
        metavar="SPEC",
        help="fault injection (repeatable): party=NAME@round=R or cohort=K@phase=P",
    )
    return p


def _cmd_stress(args) -> int:
    from rayfed.stress import parse_rates, stress

    options = {k: v for k, v in (("seed", args.seed), ("backend", args.backend)) if v is not None}
    config = {}
    if args.config:
        from rayfed.config import load_yaml

        config = load_yaml(args.config)
    kwargs: dict = {"rates": parse_rates(args.rates)} if args.rates is not None else {}
    if args.sweep:
        name, _, values = args.sweep.partition("=")
        if not name or not values:
            raise ConfigError("--sweep", f"expected OPTION=V1,V2,..., got {args.sweep!r}")
        kwargs.update(sweep=(name, values.split(",")), reps=args.reps)
    try:
        path = stress(
            args.protocol,
            {**config, **options},
            args.set,
            out_dir=args.out,
            progress=not args.quiet,
            resume=not args.fresh,
            **kwargs,
        )
    except KeyboardInterrupt as err:
        kept = getattr(err, "stress_dir", None)
        if kept is not None:
            err.reached = (
                f"after {kept[1]} of {kept[2]} points; the finished ones are in {kept[0]} "
                "(run the same command again to resume)"
            )
        raise
    import json

    for row in json.loads((path / "stress.json").read_text())["rows"]:
        print(_stress_line(row))
    print(f"table, JSON and plot: {path}")
    return 0


def _stress_line(row: dict) -> str:
    """One row of a stress table as a line of text."""
    share = row.get("not_in_sum", row.get("dropout"))  # a secure-sum sweep's: not in the sum
    dropout = "" if share is None else f"{100 * share:5.1f} %"
    sweep = row["scenario"] == "sweep"
    label = f"{row['option']}={row['value']:<8}" if sweep else f"dropout {dropout:>8}"
    sd = (lambda key: f" ± {row[key + '_sd']:.2g}") if sweep else (lambda key: "")
    if "test_mse" in row and "skipped" not in row:  # federated-mf VFL / HFL
        return (
            f"{label}  test MSE {row['test_mse']:.4f}{sd('test_mse')}  epsilon {row['epsilon']:.4g}"
        )
    if "test_mse" in row:
        return (
            f"{label}  test MSE {row['test_mse']:.4f}{sd('test_mse')}  epsilon "
            f"{row['epsilon']:.4g}  skipped {row['skipped']:g}/{row['iterations']:g} (95 % "
            f"{row['abort_ci_low']:.2f}-{row['abort_ci_high']:.2f}; finder's bound: "
            f"{row.get('abort_bound', 'not recorded')})  alive {row['alive_round1']:.0f} / "
            f"{row['alive_round2']:.0f} (rounds 1 / 2)"
        )
    if "error" in row:
        return (
            f"{label}  {row['error_metric']} {row['error']:.3e}{sd('error')}  epsilon "
            f"{row['epsilon']:.4g}  reports lost {100 * row['observed_dropout']:.1f} %  "
            f"simulated {row['simulated_round_seconds']:.1f} s per round"
        )
    if "aborts" in row:  # a secure-sum sweep
        simulated = row["simulated_round_seconds"]
        return (
            f"{label} not in the sum {dropout:>8}  aborts {row['aborts']}/{row['reps']} (95 % "
            f"{row['abort_ci_low']:.2f}-{row['abort_ci_high']:.2f}; finder's bound: "
            f"{row.get('abort_bound', 'not recorded')})  wrong sums {row['wrong_sums']}  simulated "
            + ("-" if simulated is None else f"{simulated:.1f} s")
            + " per round"
        )
    return (
        f"{row['scenario']:<30} {dropout:>8}  {row['outcome']:<9} (expected {row['expected']}) "
        f"{row['seconds']:6.2f} s"
    )


def _cmd_report(args) -> int:
    from rayfed import report

    if args.compare:
        dirs = ([args.run_dir] if args.run_dir else []) + args.compare
        out = args.out or str(Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
        written = report.compare(dirs, out)
    elif args.run_dir:
        written = report.report(args.run_dir, args.out)
    else:
        raise ConfigError("run_dir", "give a run directory or --compare DIR DIR ...")
    for path in written:
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayfed", description="Differentially private federated protocols on Ray."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the protocols").set_defaults(func=_cmd_list)
    run_p = sub.add_parser(
        "run", help="run a protocol (rayfed run PROTOCOL --help for its options)", add_help=False
    )
    _run_parser(run_p).set_defaults(func=_cmd_run)
    st = sub.add_parser("stress", help="dropout-tolerance sweep of a protocol (table, JSON, plot)")
    st.add_argument("protocol", help="secure-sum, federated-mf or square-wave")
    st.add_argument("--config", help="YAML file of options")
    st.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one option"
    )
    st.add_argument(
        "--rates",
        help="comma-separated dropout rates (default 0,0.1,0.2,0.3,0.4,0.5); ignored with --sweep",
    )
    st.add_argument(
        "--sweep",
        metavar="OPTION=V1,V2,...",
        help="sweep one option (e.g. population.markov_off=0.05,0.1,0.2) instead of the rates",
    )
    st.add_argument("--reps", type=int, default=5, help="--sweep: seeds per point (default 5)")
    st.add_argument(
        "--seed", type=int, help="root seed (default 0); a --sweep's reps use SEED, SEED+1, ..."
    )
    st.add_argument(
        "--backend", choices=["ray", "local"], help="ray (default) or local (in-process, no Ray)"
    )
    st.add_argument(
        "--out",
        default="runs",
        help="directory for the stress directory (default: runs); an unfinished stress run of "
        "the same command there is resumed",
    )
    st.add_argument("--fresh", action="store_true", help="start anew instead of resuming")
    st.add_argument("--quiet", action="store_true", help="no progress bar")
    st.set_defaults(func=_cmd_stress)
    rep = sub.add_parser(
        "report", help="plots and a one-page HTML summary of a run directory (or several)"
    )
    rep.add_argument("run_dir", nargs="?", help="a run directory (runs/<run-id>)")
    rep.add_argument("--compare", nargs="+", metavar="DIR", help="put several runs on one plot")
    rep.add_argument(
        "--out", help="where to write (default: the run directory; runs/compare-... for --compare)"
    )
    rep.set_defaults(func=_cmd_report)
    return parser


@contextlib.contextmanager
def _stop_on_signals():
    """SIGINT (Ctrl-C) and SIGTERM raise :class:`Interrupted` in the main thread, installed
    explicitly: a process started in the background by a non-interactive shell inherits SIGINT
    *ignored*, and Python then never raises KeyboardInterrupt (a ``--backend local`` run went on
    after Ctrl-C); Ray's own SIGTERM handler (``sys.exit``) is kept out by ``ensure_ray``. A
    second signal while the first unwinds (the run directory marked, Ray stopping) is ignored
    with a note, so the cleanup cannot be cut short and leave Ray's processes behind; a third
    exits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, _frame):
        fired.append(signum)
        Interrupted.caught = fired[0]
        if len(fired) == 1:
            raise Interrupted(signum)
        if len(fired) == 2:
            print(
                "rayfed: stopping cleanly (Ray shutting down); again to exit at once",
                file=sys.stderr,
            )
            return
        os._exit(128 + fired[0])

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        Interrupted.caught = None
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _interrupted(err: KeyboardInterrupt) -> int:
    """The one line an interrupted command prints, after stopping this process's Ray (nothing
    of it left behind); the exit status 128 + the signal's number (130 SIGINT, 143 SIGTERM)."""
    from rayfed.runtime import shutdown

    signum = Interrupted.signal_of(err)
    with contextlib.suppress(Exception):
        shutdown()
    reached = getattr(err, "reached", None)
    name = signal.Signals(signum).name
    print(f"rayfed: interrupted by {name}" + (f" {reached}" if reached else ""), file=sys.stderr)
    return 128 + signum


def _one_line_warnings(show):
    """rayfed's own warnings (a trace that covers the run in part, a fault that never fired) as
    one line on stderr, without the source line Python's format adds; others as they were."""
    package = str(Path(__file__).parent)

    def shown(message, category, filename, lineno, file=None, line=None):
        if not str(filename).startswith(package):
            return show(message, category, filename, lineno, file, line)
        print(f"rayfed: warning: {message}", file=file or sys.stderr)

    return shown


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _stop_on_signals(), warnings.catch_warnings():
            warnings.showwarning = _one_line_warnings(warnings.showwarning)
            try:
                code = args.func(args)
            except KeyboardInterrupt as err:  # still under the handlers: a 2nd signal is noted
                return _interrupted(err)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # the reader went away (``rayfed list | head -1``): stop quietly, as a tool killed by
        # SIGPIPE would; point stdout at /dev/null so the exit-time flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except ConfigError as err:
        print(f"rayfed: configuration error: {err}", file=sys.stderr)
        return 2
    except RayfedError as err:
        print(f"rayfed: {type(err).__name__}: {err}", file=sys.stderr)
        for line in loss_lines(getattr(err, "losses", [])):  # what killed the quorum, say
            print(line, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
