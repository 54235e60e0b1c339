"""In words, what a dispatch policy does on a device: the lines ``twell info`` prints.

Since session 37 :data:`~twell.nn.DEFAULT_POLICY` and :data:`~twell.nn.train_dispatch.DEFAULT_TRAIN_POLICY` hold their
H200 tables to Hopper, so the same model runs sparse on an H200 and dense on an A100.  A user who sees no speed-up
needs to learn which of the policy's conditions (device type, compute capability, layer shape) sent the layers dense,
and what to run to measure their own GPU; these summaries say it without timing anything.
"""

from __future__ import annotations

from ..ops.decode import DECODE_MAX_TOKENS
from .call_graphs import RECORD_MAX_FLOPS, RECORD_MIN_FLOPS
from .dispatch import DispatchPolicy, capability_allowed, dense_ffn_flops
from .train_dispatch import TrainDispatchPolicy


def _caps_text(capabilities: tuple[tuple[int, int], ...] | None) -> str:
    return "any" if capabilities is None else ", ".join(f"{a}.{b}" for a, b in capabilities)


def _shapes_text(shapes: list[tuple[int, int]]) -> str:
    return ", ".join(f"{d}x{f}" for d, f in sorted(shapes))


def _held_back(device_types: tuple[str, ...], capabilities: tuple[tuple[int, int], ...] | None, force: bool,
               device_type: str, capability: tuple[int, int] | None, measure: str) -> str | None:
    """Why tables held to ``device_types`` / ``capabilities`` do not apply on this device, or None where they do;
    ``measure`` names what measures a table on this GPU."""
    if force:
        return None
    if device_type not in device_types:
        return f"dense on {device_type}: the tables were measured on {', '.join(device_types)}"
    if not capability_allowed(capabilities, device_type, capability):
        assert capability is not None  # capability_allowed holds nothing back without one
        return (f"dense on this GPU (compute capability {capability[0]}.{capability[1]}): the tables hold for "
                f"{_caps_text(capabilities)}; {measure}")
    return None


def inference_summary(policy: DispatchPolicy, device_type: str, capability: tuple[int, int] | None) -> str:
    """What ``policy`` does for :class:`~twell.nn.SparseGatedMLP` calls on a ``device_type`` device of compute
    ``capability`` (None off CUDA, or not known)."""
    held = _held_back(policy.device_types, policy.capabilities, policy.force, device_type, capability,
                      "`twell tune-dispatch --shape HIDDENxFFN` measures a table here")
    if held is not None:
        return held
    if policy.force:
        return "forced: the table applies on every device, dtype and layer shape" + _eager_floor_text(policy)
    own = [shape for shape, _ in policy.shape_tables if policy.shapes is None or shape in policy.shapes]
    if policy.shapes is None:
        text = "one table for every layer shape"
        if own:
            text += f"; its own table for {len(own)} shapes ({_shapes_text(own)})"
    else:
        text = f"measured tables for {len(policy.shapes)} layer shapes ({_shapes_text(list(policy.shapes))})"
        text += ("; a shape between them follows their envelope, others run dense" if policy.other_shapes == "envelope"
                 else "; other shapes run dense")
    if policy.decode_tables:
        text += (f"; in CUDA graphs (decode_graphed), calls of 1-{DECODE_MAX_TOKENS} tokens follow the decode tables "
                 f"of {len(policy.decode_tables)} shapes")
    return text + _eager_floor_text(policy)


def _eager_floor_text(policy: DispatchPolicy) -> str:
    """The clause on the policy's eager floor (``eager_min_tokens``, ``eager_min_flops``), or nothing without one."""
    parts = []
    if policy.eager_min_tokens:
        parts.append(f"of fewer than {policy.eager_min_tokens} tokens (eager_min_tokens)")
    if policy.eager_min_flops:
        floors = ", ".join(f"{d}x{f}: {policy.eager_floor_tokens((d, f))}" for d, f in _FLOOR_EXAMPLES)
        parts.append(f"whose dense FFN would take fewer than {policy.eager_min_flops:.3g} FLOPs (eager_min_flops; "
                     f"in tokens {floors})")
    if not parts:
        return ""
    lo, hi = (int(flops // dense_ffn_flops(1, (2048, 5632))) for flops in (RECORD_MIN_FLOPS, RECORD_MAX_FLOPS))
    return (f"; eager calls (also those compiled outside static_dispatch) {' or '.join(parts)} run dense, but for "
            f"those a layer records in CUDA graphs (SparseGatedMLP eager_graphs, on by default: from {lo} tokens' work "
            f"at 2048x5632 below the floor, up to {hi} above it; twell.nn.call_graphs)")


#: Layer shapes whose eager floor in tokens the summary names: the paper's, a 7-8B model's and a 0.6B model's.
_FLOOR_EXAMPLES = ((2048, 5632), (4096, 14336), (1024, 3072))


def training_summary(policy: TrainDispatchPolicy, device_type: str, capability: tuple[int, int] | None) -> str:
    """What ``policy`` does for training calls (the autograd path) on a ``device_type`` device of ``capability``."""
    held = _held_back(policy.device_types, policy.capabilities, policy.force, device_type, capability,
                      ("`twell bench train-ffn --sparse-impl hot-cold --shape HIDDENxFFN` measures a table here "
                       "(<stem>_train_policy.json)"))
    if held is not None:
        return held
    if policy.force:
        return "forced: the tables apply on every device, dtype and layer shape"
    shapes = [shape for shape, table in policy.tables.items() if table]
    dtypes = ", ".join(str(t).removeprefix("torch.") for t in policy.dtypes)
    if not shapes and not policy.default_table:
        return "dense for every layer shape (no table sends a call sparse)"
    if not shapes:
        return f"sparse training op in {dtypes} for every layer shape, by the default table"
    text = f"sparse training op in {dtypes} for {_shapes_text(shapes)}"
    return text + ("; other shapes follow the default table" if policy.default_table else "; other shapes run dense")
