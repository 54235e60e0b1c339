"""A :class:`~twell.nn.DispatchPolicy` as a JSON file: what ``twell tune-dispatch`` writes and a deployment loads.

The table of a policy is a measurement of one GPU, dtype and layer shape, so it travels as a file next to
the model rather than in its config::

    policy = twell.nn.load_policy("h200_bf16_5120x13824.json")
    twell.models.set_dispatch_policy(model, policy)

The file holds the policy's fields and, under ``"measured"``, what it was derived from (device, dtype,
commit, the timed points); loading checks every field and refuses unknown ones, so a typo is an error
rather than a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._policy_json import check_header, read_json, shape_table_list, write_json
from .dispatch import DispatchPolicy

__all__ = ["POLICY_FORMAT", "POLICY_VERSION", "load_policy", "policy_from_dict", "policy_to_dict", "save_policy"]

POLICY_FORMAT = "twell.dispatch_policy"
POLICY_VERSION = 1
_POLICY_KEYS = ("table", "device_types", "force", "shapes", "decode_max_tokens", "shape_tables", "other_shapes",
                "decode_tables", "decode_graphed", "capabilities", "eager_min_tokens", "eager_min_flops")
_FILE_KEYS = ("format", "version", *_POLICY_KEYS, "measured")


def policy_to_dict(policy: DispatchPolicy, *, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON-ready form of ``policy`` (``measured``: free-form provenance, stored as given)."""
    if not isinstance(policy, DispatchPolicy):
        raise TypeError(f"policy must be a twell.nn.DispatchPolicy, got {type(policy).__name__}")
    return {
        "format": POLICY_FORMAT,
        "version": POLICY_VERSION,
        "table": [[m, dens] for m, dens in policy.table],
        "device_types": list(policy.device_types),
        "force": policy.force,
        "shapes": None if policy.shapes is None else [[h, f] for h, f in policy.shapes],
        "decode_max_tokens": policy.decode_max_tokens,
        "shape_tables": [{"shape": [h, f], "table": [[m, dens] for m, dens in table]}
                         for (h, f), table in policy.shape_tables],
        "other_shapes": policy.other_shapes,
        "decode_tables": [{"shape": [h, f], "table": [[m, dens] for m, dens in table]}
                          for (h, f), table in policy.decode_tables],
        "decode_graphed": policy.decode_graphed,
        "capabilities": None if policy.capabilities is None else [list(c) for c in policy.capabilities],
        "eager_min_tokens": policy.eager_min_tokens,
        "eager_min_flops": policy.eager_min_flops,
        "measured": measured if measured is not None else {},
    }


def policy_from_dict(data: object, *, source: str = "policy") -> DispatchPolicy:
    """The policy of a dict written by :func:`policy_to_dict`; every field checked (``source`` names it in errors)."""
    data = check_header(data, source=source, what="dispatch policy", fmt=POLICY_FORMAT, version=POLICY_VERSION,
                        keys=_FILE_KEYS, required=("table", "device_types", "shapes"))
    if not isinstance(data["device_types"], list):
        raise TypeError(f"{source}: device_types must be a list of device type strings such as ['cuda'], "
                        f"got {data['device_types']!r}")
    shapes = data["shapes"]
    if shapes is not None and not isinstance(shapes, list):
        raise TypeError(f"{source}: shapes must be null or a list of [hidden_size, intermediate_size], got {shapes!r}")
    if shapes is not None:
        for s in shapes:
            if not (isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in s)):
                raise TypeError(f"{source}: each shape must be [hidden_size, intermediate_size] (ints), got {s!r}")
    shape_tables = shape_table_list(data, "shape_tables", source)
    # files written before session 34 have no decode tables: their graphed calls followed decode_max_tokens only
    decode_tables = shape_table_list(data, "decode_tables", source)
    try:
        return DispatchPolicy(
            table=tuple(tuple(row) if isinstance(row, list) else row for row in data["table"]),
            device_types=tuple(data["device_types"]),
            force=data.get("force", False),
            shapes=None if shapes is None else tuple((h, f) for h, f in shapes),
            decode_max_tokens=data.get("decode_max_tokens", 0),
            shape_tables=tuple((e["shape"], e["table"]) for e in shape_tables),  # lists: normalised there
            # files written before session 32 have no such key: their other shapes ran dense
            other_shapes=data.get("other_shapes", "dense"),
            decode_tables=tuple((e["shape"], e["table"]) for e in decode_tables),
            decode_graphed=data.get("decode_graphed", False),
            # files written before session 37 have no such key: their tables held on any CUDA device
            capabilities=data.get("capabilities"),
            # files written before session 41 have no such key: no floor for eager calls
            eager_min_tokens=data.get("eager_min_tokens", 0),
            # files written before session 43 have no such key: no floor in work
            eager_min_flops=data.get("eager_min_flops", 0.0),
        )
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{source}: {exc}") from None


def save_policy(policy: DispatchPolicy, path: str | Path, *, measured: dict[str, Any] | None = None) -> Path:
    """Write ``policy`` (and its provenance ``measured``) to ``path`` as JSON; return the path."""
    return write_json(path, policy_to_dict(policy, measured=measured))


def load_policy(path: str | Path) -> DispatchPolicy:
    """The :class:`DispatchPolicy` stored at ``path`` by :func:`save_policy` (or ``twell tune-dispatch``)."""
    path = Path(path)
    return policy_from_dict(read_json(path), source=str(path))
