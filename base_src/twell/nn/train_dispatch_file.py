"""A :class:`~twell.nn.train_dispatch.TrainDispatchPolicy` as a JSON file: what ``twell bench train-ffn --sparse-impl
hot-cold`` writes (``<stem>_train_policy.json``) and a training run loads.

The shipped :data:`~twell.nn.train_dispatch.DEFAULT_TRAIN_POLICY` holds one H200 table (2048 x 5632) to Hopper; on any
other GPU or layer shape ``train_impl="auto"`` trains dense until a table is measured there.  Like the inference
policy (:mod:`twell.nn.dispatch_file`), the table is a measurement of one GPU, dtype and layer shape, so it travels as
a file::

    policy = twell.nn.load_train_policy("bench-results/train_ffn_train_policy.json")
    twell.models.set_train_dispatch_policy(model, policy)

The file holds the policy's fields and, under ``"measured"``, what it was derived from; loading checks every field and
refuses unknown ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ._policy_json import check_header, read_json, shape_table_list, write_json
from .train_dispatch import TrainDispatchPolicy

__all__ = ["TRAIN_POLICY_FORMAT", "TRAIN_POLICY_VERSION", "load_train_policy", "save_train_policy",
           "train_policy_from_dict", "train_policy_to_dict"]

TRAIN_POLICY_FORMAT = "twell.train_dispatch_policy"
TRAIN_POLICY_VERSION = 1
#: The dtypes a file may name (the compute dtypes the training op runs in).
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_POLICY_KEYS = ("tables", "default_table", "device_types", "dtypes", "force", "capabilities")
_FILE_KEYS = ("format", "version", *_POLICY_KEYS, "measured")


def _dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"dtype {dtype} has no name in a train policy file; accepted: {sorted(_DTYPES)}")


def train_policy_to_dict(policy: TrainDispatchPolicy, *, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON-ready form of ``policy`` (``measured``: free-form provenance, stored as given)."""
    if not isinstance(policy, TrainDispatchPolicy):
        raise TypeError(f"policy must be a twell.nn.train_dispatch.TrainDispatchPolicy, got {type(policy).__name__}")
    return {
        "format": TRAIN_POLICY_FORMAT,
        "version": TRAIN_POLICY_VERSION,
        "tables": [{"shape": [h, f], "table": [[m, dens] for m, dens in table]}
                   for (h, f), table in sorted(policy.tables.items())],
        "default_table": [[m, dens] for m, dens in policy.default_table],
        "device_types": list(policy.device_types),
        "dtypes": [_dtype_name(t) for t in policy.dtypes],
        "force": policy.force,
        "capabilities": None if policy.capabilities is None else [list(c) for c in policy.capabilities],
        "measured": measured if measured is not None else {},
    }


def train_policy_from_dict(data: object, *, source: str = "train policy") -> TrainDispatchPolicy:
    """The policy of a dict written by :func:`train_policy_to_dict`; every field checked (``source`` names it)."""
    data = check_header(data, source=source, what="train dispatch policy", fmt=TRAIN_POLICY_FORMAT,
                        version=TRAIN_POLICY_VERSION, keys=_FILE_KEYS, required=("tables", "device_types", "dtypes"),
                        other="; an inference policy loads with twell.nn.load_policy")
    tables = shape_table_list(data, "tables", source)
    for key in ("device_types", "dtypes"):
        if not isinstance(data[key], list) or not all(isinstance(v, str) for v in data[key]):
            raise TypeError(f"{source}: {key} must be a list of strings, got {data[key]!r}")
    bad = [name for name in data["dtypes"] if name not in _DTYPES]
    if bad:
        raise ValueError(f"{source}: unknown dtypes {bad}; accepted: {sorted(_DTYPES)}")
    for e in tables:
        if not (isinstance(e["shape"], list) and len(e["shape"]) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in e["shape"])):
            raise TypeError(f"{source}: each shape must be [hidden_size, intermediate_size] (ints > 0), "
                            f"got {e['shape']!r}")
    shapes = [tuple(e["shape"]) for e in tables]
    if len(set(shapes)) != len(shapes):
        raise ValueError(f"{source}: a layer shape appears twice in tables: {shapes}")
    try:
        return TrainDispatchPolicy(
            tables={shape: tuple(tuple(r) if isinstance(r, list) else r for r in e["table"])
                    for shape, e in zip(shapes, tables, strict=True)},
            default_table=tuple(tuple(r) if isinstance(r, list) else r for r in data.get("default_table", [])),
            device_types=tuple(data["device_types"]),
            dtypes=tuple(_DTYPES[name] for name in data["dtypes"]),
            force=data.get("force", False),
            capabilities=data.get("capabilities"),
        )
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{source}: {exc}") from None


def save_train_policy(policy: TrainDispatchPolicy, path: str | Path, *,
                      measured: dict[str, Any] | None = None) -> Path:
    """Write ``policy`` (and its provenance ``measured``) to ``path`` as JSON; return the path."""
    return write_json(path, train_policy_to_dict(policy, measured=measured))


def load_train_policy(path: str | Path) -> TrainDispatchPolicy:
    """The :class:`TrainDispatchPolicy` stored at ``path`` by :func:`save_train_policy` (or ``twell bench
    train-ffn --sparse-impl hot-cold``)."""
    path = Path(path)
    return train_policy_from_dict(read_json(path), source=str(path))
