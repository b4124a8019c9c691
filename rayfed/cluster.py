"""Checking a Ray cluster-launcher config (``cluster.yaml``) without launching anything.

This is the one place in rayfed that touches Ray's *private* autoscaler API
(``ray.autoscaler._private.util.prepare_config`` and ``validate_config``, Ray 2.60). Those functions
may change between Ray releases; if they do, only this module needs updating.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from rayfed.errors import ConfigError

_FIELD = "cluster.yaml"
_ALLOWED = "a Ray cluster-launcher config (https://docs.ray.io/en/latest/cluster/vms/references/ray-cluster-configuration.html)"


def validate_cluster_config(path: str | Path) -> dict[str, Any]:
    """Load a cluster-launcher YAML, fill in defaults as ``ray up`` does, and check it.

    Only the schema and Ray's own consistency rules are checked: nothing contacts the cloud
    provider (no credentials, no instance-type lookups, no bootstrap of keys or subnets).
    Returns the config with Ray's defaults filled in. Raises :class:`ConfigError` with Ray's
    message when the file is missing, not YAML, or not a valid config.
    """
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config  # private API

    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(_FIELD, f"cannot read {str(path)!r}: {err}", _ALLOWED) from err
    except yaml.YAMLError as err:
        raise ConfigError(_FIELD, f"{str(path)!r} is not valid YAML: {err}", _ALLOWED) from err
    if not isinstance(config, dict) or not isinstance(config.get("provider"), dict):
        raise ConfigError(_FIELD, f"{str(path)!r} has no `provider` mapping", _ALLOWED)
    try:
        # The same two steps as `ray up` (commands._bootstrap_config), minus the provider calls.
        prepared = prepare_config(copy.deepcopy(config))
        validate_config(prepared)
    except jsonschema.ValidationError as err:
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(_FIELD, f"{path}: at {where}: {err.message}", _ALLOWED) from err
    except (
        ValueError,
        KeyError,
        TypeError,
        AssertionError,
        NotImplementedError,
        RuntimeError,
    ) as err:
        raise ConfigError(_FIELD, f"{path}: {type(err).__name__}: {err}", _ALLOWED) from err
    return prepared
