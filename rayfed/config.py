"""Configuration: what the user wrote (YAML, ``--set key=value``, API keywords) → validated dataclasses.

A run's configuration is two frozen dataclasses: :class:`RunOptions` (seed, deadline, backend,
address, output) and the protocol's own config (its parameters and a nested :class:`DataConfig`).
Both hold exactly what the user wrote; :func:`build_config` converts types, rejects unknown keys,
and calls each config's ``validate()`` — all before any actor starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from rayfed.errors import ConfigError


@dataclass(frozen=True)
class Bounds:
    """The range of a numeric option: ``at_least``/``above`` below, ``at_most``/``below`` above."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    #: why the range ends where it does (said in the refusal), where that is not self-evident
    why: str | None = None

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return not (
            (self.at_least is not None and value < self.at_least)
            or (self.above is not None and value <= self.above)
            or (self.at_most is not None and value > self.at_most)
            or (self.below is not None and value >= self.below)
        )

    def text(self) -> str:
        parts = [
            f"{op} {bound:g}"
            for op, bound in (
                (">=", self.at_least),
                (">", self.above),
                ("<=", self.at_most),
                ("<", self.below),
            )
            if bound is not None
        ]
        return " and ".join(parts) or "finite"


def option(
    default: Any,
    help: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    why: str | None = None,
    size: bool = False,
    when: dict[str, tuple] | None = None,
    source: Literal["file", "synthetic"] | None = None,
    **kwargs,
) -> Any:
    """A dataclass field with a help text (shown by ``rayfed run <protocol> --help``).

    A numeric option declares its range here (``at_least``, ``above``, ``at_most``, ``below``):
    the core refuses a value outside it, naming the option, before any data is built, and the
    conformance suite derives its bad-value cases from the same declaration. ``size`` marks an
    option the run's memory grows with (users, dimensions, bits), checked against the machine.

    ``when`` names the modes that read the option (``{"method": ("sw-ems", "sw-em")}``: every
    key must hold; a mode whose default depends on other options is read through the config's
    ``resolved_<key>()``, e.g. federated-mf's ``method``) and ``source`` the data source (``"file"``: only with ``data.path``;
    ``"synthetic"``: only without): the core refuses the option, set away from its default,
    anywhere else (:func:`check_applicable`) — an option the run would not read is an error, not
    silently ignored.
    """
    metadata: dict[str, Any] = {"help": help, "size": size, "when": when or {}, "source": source}
    if (at_least, above, at_most, below) != (None, None, None, None):
        metadata["bounds"] = Bounds(at_least, above, at_most, below, why)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


def check_file(field: str, path: str | Path) -> None:
    """ConfigError naming ``field`` unless ``path`` is an existing file (not a directory)."""
    where = Path(path).expanduser()
    if not where.exists():
        raise ConfigError(
            field, f"file {str(path)!r} does not exist", "an existing CSV/Parquet/Arrow file"
        )
    if where.is_dir():
        raise ConfigError(
            field, f"{str(path)!r} is a directory, not a file", "an existing CSV/Parquet/Arrow file"
        )


@dataclass(frozen=True)
class DataConfig:
    """Where a run's data comes from and how it is split among the parties."""

    path: str | None = option(
        None, "CSV, Parquet or Arrow IPC file; empty: the protocol's synthetic generator"
    )
    format: Literal["auto", "csv", "parquet", "arrow"] = option(
        "auto", "file format (auto: from the suffix)"
    )
    key: str | None = option(
        None, "user key column: aligns rows across parties / deals users to cohorts"
    )
    columns: dict[str, list[str]] | None = option(
        None,
        "vertical split: party name -> its columns (default: columns dealt evenly over the parties)",
    )

    def validate(self) -> None:
        if self.path is not None:
            check_file("data.path", self.path)
        if self.columns is not None:
            if not self.columns:
                raise ConfigError("data.columns", "is empty", "a mapping party -> list of columns")
            for party, cols in self.columns.items():
                if not cols:
                    raise ConfigError(
                        f"data.columns.{party}", "lists no column", "one or more column names"
                    )


@dataclass(frozen=True)
class RunOptions:
    """How a run is executed, common to every protocol."""

    seed: int = option(
        0, "root seed: every random stream of the run is derived from it", at_least=0
    )
    deadline_s: float = option(120.0, "deadline of every remote wait, in seconds", above=0)
    backend: Literal["ray", "local"] = option(
        "ray", "ray: Ray actors; local: same drivers in-process, no Ray"
    )
    randomness: Literal["seeded", "secure"] = option(
        "seeded",
        "where DP noise and secret keys come from: seeded (from the root seed: reproducible, the "
        "guarantee holds only while the seed is secret from every party) or secure (the OS, in "
        "the actor that draws them)",
    )
    address: str | None = option(
        None, "Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)"
    )
    num_cpus: int | None = option(None, "CPUs of the embedded local Ray (default: all)", at_least=1)
    out_dir: str | None = option("runs", "where run directories are written; empty: write nothing")
    party_resource: str | None = option(
        None,
        "custom node resource every party actor needs 1 of: declare it as 1 per node (cluster.yaml "
        "resources, or ray start --resources) to place one party per node",
    )
    spread: bool = option(True, "spread party and cohort actors over the nodes (Ray SPREAD)")
    cohort_memory_mb: int | None = option(
        None,
        "memory each cohort actor reserves (Ray's memory resource); default: estimated from its "
        "data, and checked against the cluster before the run starts",
        at_least=1,
    )
    fail: list[str] | None = option(
        None, "fault injection: party=NAME@round=R or cohort=K@phase=P (a list; see rayfed.faults)"
    )

    def validate(self) -> None:
        from rayfed.faults import parse

        for text in self.fail or []:
            parse(text)


# --- conversion ----------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert ``value`` (from YAML or ``--set``) to the annotated type ``tp``, or raise ConfigError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    value = _plain(value)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, name)
            except ConfigError as err:
                errors.append(f"as {_type_name(arg)}: {err.problem}")
        raise ConfigError(name, f"{value!r} is not a valid {_type_name(tp)} ({'; '.join(errors)})")
    if origin is Literal:
        if value not in args:
            raise ConfigError(name, f"{value!r} is not an allowed value", [repr(a) for a in args])
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(name, f"expected a mapping, got {value!r}")
        return from_mapping(tp, value, prefix=f"{name}.")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(name, f"expected a list, got {value!r}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(name, f"expected a mapping, got {value!r}")
        kt, vt = args if args else (Any, Any)
        return {coerce(k, kt, name): coerce(v, vt, f"{name}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(name, f"expected true or false, got {value!r}")
    if tp in (int, float) and isinstance(value, str):
        value = _number(value, name)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(name, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(name, f"expected a finite number, got {value!r}", "a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(name, f"expected a string, got {value!r}")
        return str(value)
    return value


def _plain(value: Any) -> Any:
    """What the Python API may pass besides plain values, as one: a numpy number (np.int64(3),
    np.float32(0.5), np.bool_) as its Python number, a numpy array as a list, a path
    (pathlib.Path) as its string."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _number(text: str, name: str) -> int | float:
    """'2e4' or '1e-5' (YAML 1.1 reads exponents without a dot as strings) as a number."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, f"expected a number, got {text!r}") from None
    return (
        int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value
    )


def _unknown(cls: type, key: str, prefix: str, known: list[str]) -> None:
    """An unknown key is a ConfigError: one the class lists in ``MOVED`` (old name -> where it
    went) names its replacement, any other the keys allowed."""
    moved = getattr(cls, "MOVED", {}).get(key)
    if moved is not None:
        raise ConfigError(f"{prefix}{key}", f"this option was removed: moved to {moved}")
    raise ConfigError(f"{prefix}{key}", "unknown configuration key", known)


def from_mapping(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys are a ConfigError naming the allowed ones."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in values:
        if key not in known:
            _unknown(cls, key, prefix, sorted(known))
    kwargs = {k: coerce(v, hints[k], f"{prefix}{k}") for k, v in values.items()}
    for key, value in kwargs.items():
        bounds = known[key].metadata.get("bounds")
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if bounds is not None and numeric and not bounds.admits(value):
            why = f": {bounds.why}" if bounds.why else ""
            raise ConfigError(f"{prefix}{key}", f"{value!r} is out of range{why}", bounds.text())
    obj = cls(**kwargs)
    check_applicable(obj, prefix)  # the modes an option names are its siblings
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def _mode(cfg: Any, key: str) -> Any:
    """The mode ``key`` an option's ``when`` names: ``cfg.resolved_<key>()`` when the config
    derives it (a default that depends on other options), else the field's value."""
    resolve = getattr(cfg, f"resolved_{key}", None)
    return resolve() if callable(resolve) else getattr(cfg, key)


def check_applicable(cfg: Any, prefix: str = "") -> None:
    """ConfigError for an option set away from its default where the chosen mode or data source
    does not read it (its ``when`` and ``source`` declarations), and for ``data.key`` or
    ``data.columns`` without a file. ``prefix`` names a nested group of options (``population.``),
    whose modes are its own fields."""
    default = type(cfg)()
    data = getattr(cfg, "data", None)
    path = getattr(data, "path", None)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        for key, allowed in f.metadata.get("when", {}).items():
            actual = _mode(cfg, key)
            if actual not in allowed:
                raise ConfigError(
                    prefix + f.name,
                    f"does not apply to {prefix}{key}={actual}",
                    f"{prefix}{key} in ({', '.join(map(str, allowed))}), or drop {prefix}{f.name}",
                )
        source = f.metadata.get("source")
        if source == "file" and path is None:
            raise ConfigError(
                f.name,
                "applies to a data file, but no data.path is given",
                "set data.path, or drop this option for synthetic data",
            )
        if source == "synthetic" and path is not None:
            raise ConfigError(
                f.name, "applies to synthetic data only, but data.path is given", "drop it"
            )
    if data is None or path is not None:
        return
    for name in ("columns", "key"):
        if getattr(data, name) is not None:
            raise ConfigError(
                f"data.{name}",
                "applies to a data file, but no data.path is given",
                "set data.path, or drop this option for synthetic data",
            )


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """``"data.path=x.csv"`` → (["data", "path"], "x.csv"); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError("--set", f"expected key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError("--set", f"empty key in {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def merge(base: dict[str, Any], path: list[str], value: Any) -> None:
    node = base
    for part in path[:-1]:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(".".join(path), f"{part!r} is not a mapping")
    node[path[-1]] = value


def load_yaml(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError("--config", f"cannot read {path}: {err}") from err
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError("--config", f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{path} must hold a mapping of option: value")
    return data


def build_config(config_cls: type, values: dict[str, Any]) -> tuple[RunOptions, Any]:
    """Split ``values`` into RunOptions and the protocol's config; validate both."""
    run_keys = {f.name for f in dataclasses.fields(RunOptions)}
    proto_keys = {f.name for f in dataclasses.fields(config_cls)}
    spread = values.get("spread")
    numeric = isinstance(spread, (int, float)) and not isinstance(spread, bool)
    if "cluster_sd" in proto_keys and numeric:  # the synthetic data's std was called spread too
        raise ConfigError(
            "spread",
            f"{spread!r}: spread is the run option that spreads actors over nodes (true/false)",
            f"cluster_sd={spread} for the synthetic data's std per coordinate",
        )
    for key in values:
        if key not in run_keys and key not in proto_keys:
            _unknown(config_cls, key, "", sorted(run_keys | proto_keys))
    run = from_mapping(RunOptions, {k: v for k, v in values.items() if k in run_keys})
    proto = from_mapping(config_cls, {k: v for k, v in values.items() if k not in run_keys})
    return run, proto


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(name, type, default, help) for every option of ``cls``, nested dataclasses expanded."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, prefix=f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        kind = _type_name(tp)
        if "bounds" in f.metadata:
            kind += f" ({f.metadata['bounds'].text()})"
        rows.append((prefix + f.name, kind, repr(default), f.metadata.get("help", "")))
    return rows


def to_dict(obj: Any) -> Any:
    """A JSON-ready dict of a config dataclass (for manifest.json)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
