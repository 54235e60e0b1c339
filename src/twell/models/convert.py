"""In-place conversion of an existing model's gated MLPs to :class:`~twell.nn.SparseGatedMLP` and back.

:func:`apply` finds every Llama/Qwen2-family MLP (a module with ``gate_proj``, ``up_proj`` and
``down_proj`` ``nn.Linear`` children and an ``act_fn``; also :class:`~twell.nn.DenseReluGatedMLP`) and
replaces it by a :class:`~twell.nn.SparseGatedMLP` that **shares** its three ``nn.Linear`` modules: no
weight is copied, the model's state-dict keys do not change, an optimizer built before the conversion
still holds the right parameters, and ``model.to(...)`` moves both views at once.

The conversion preserves the function only for models whose MLP gate already is ReLU.  Any other
activation is refused, naming it, unless ``allow_silu=True`` (SiLU only): that is the sparse
fine-tuning use, where a SiLU model is switched to ReLU and trained with the L1 penalty; the
converted model then computes with ReLU, the report says so, and ``config.hidden_act`` is set to
``"relu"`` so that a saved checkpoint describes what the weights are meant for.

:func:`revert` puts back the module each :class:`SparseGatedMLP` replaced when :func:`apply` recorded
it (same object, re-attached to the current ``nn.Linear`` modules, so training done meanwhile is kept),
and otherwise a :class:`~twell.nn.DenseReluGatedMLP` sharing the weights.

:func:`apply` also gives the converted model's transformers ``LlamaModel`` / ``Qwen2Model`` backbones the twell
models' causal-mask rules (:mod:`twell.models.causal_mask`: SDPA's ``is_causal`` instead of a materialised causal
mask in compiled and recorded forwards where the call proves the mask causal); :func:`revert` turns them off.
Nothing is written into the config for that, so a checkpoint saved from a converted model is the one it would be
without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import DenseReluGatedMLP, SparseGatedMLP
from . import causal_mask

__all__ = ["ConversionReport", "ConvertedModule", "apply", "revert"]

_PROJ = ("gate_proj", "up_proj", "down_proj")
#: Attribute (outside the module registry, so not in the state dict) holding the replaced MLP.
_ORIGINAL_ATTR = "_twell_original_mlp"
#: Attribute on the converted model holding ``config.hidden_act`` as it was before ``allow_silu``.
_ORIGINAL_ACT_ATTR = "_twell_original_hidden_act"
_MLP_KWARGS = ("backend", "tile", "capacity", "precision", "policy", "l0_refresh_every", "eager_graphs")


@dataclass(frozen=True)
class ConvertedModule:
    """One converted MLP: qualified name, ``hidden_size`` d, ``intermediate_size`` F, class and activation."""

    name: str
    hidden_size: int
    intermediate_size: int
    original_class: str
    activation: str
    new_class: str


@dataclass
class ConversionReport:
    """What :func:`apply` or :func:`revert` did; ``print(report)`` gives a readable summary.

    Attributes:
        direction: ``"apply"`` or ``"revert"``.
        modules: one :class:`ConvertedModule` per converted MLP, in module order.
        notes: behaviour changes the caller must know about (e.g. SiLU replaced by ReLU).
        causal_mask_backbones: qualified names of the backbones whose causal-mask rules
            (:mod:`twell.models.causal_mask`) were turned on (apply) or off (revert); ``""`` is the model itself.
    """

    direction: str
    modules: list[ConvertedModule] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    causal_mask_backbones: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.modules]

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """``{name: (hidden_size, intermediate_size)}``."""
        return {m.name: (m.hidden_size, m.intermediate_size) for m in self.modules}

    @property
    def original_activations(self) -> set[str]:
        return {m.activation for m in self.modules}

    @property
    def activation_changed(self) -> bool:
        """True when a converted module computed something other than ReLU before (``allow_silu``)."""
        return any(m.activation != "relu" for m in self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def summary(self) -> str:
        verb = "converted to SparseGatedMLP" if self.direction == "apply" else "reverted to dense"
        lines = [f"twell {self.direction}: {len(self.modules)} MLP module(s) {verb}"]
        groups: dict[tuple[int, int, str, str, str], list[str]] = {}
        for m in self.modules:
            groups.setdefault(
                (m.hidden_size, m.intermediate_size, m.original_class, m.activation, m.new_class), []
            ).append(m.name)
        for (d, f, cls, act, new), names in groups.items():
            shown = ", ".join(names[:4]) + (f", ... (+{len(names) - 4} more)" if len(names) > 4 else "")
            lines.append(f"  {len(names)} x {cls}(act={act}) -> {new}, hidden={d}, intermediate={f}: {shown}")
        if self.causal_mask_backbones:
            names = ", ".join(n or "<model>" for n in self.causal_mask_backbones)
            state = "on" if self.direction == "apply" else "off"
            lines.append(f"  causal-mask rules (SDPA is_causal in compiled/recorded forwards) {state} for: {names}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------------------------------------- helpers
def _activation_name(act: object) -> str:
    """A canonical name for an ``act_fn``: ``relu``, ``silu``, or the (lower-cased) class/function name.

    Only an exact ReLU counts as ``relu`` (``nn.ReLU``, ``F.relu``, ``torch.relu``): ReLU6 or a
    leaky ReLU are not the function the sparse FFN computes.
    """
    if isinstance(act, nn.ReLU) or act in (F.relu, torch.relu):
        return "relu"
    if isinstance(act, nn.SiLU) or act in (F.silu,):
        return "silu"
    name = getattr(act, "__name__", None) or type(act).__name__
    low = name.lower()
    if low in ("siluactivation", "swish", "swishactivation"):
        return "silu"
    if low.endswith("activation"):
        low = low[: -len("activation")]
    return low or name


def _is_gated_mlp(module: nn.Module) -> bool:
    if isinstance(module, SparseGatedMLP):
        return False
    if not all(isinstance(getattr(module, p, None), nn.Linear) for p in _PROJ):
        return False
    return isinstance(module, DenseReluGatedMLP) or hasattr(module, "act_fn")


def _module_activation(module: nn.Module) -> str:
    """The module's activation name; for one that is neither ReLU nor SiLU the config's ``hidden_act`` string
    (what the user wrote, e.g. ``gelu_pytorch_tanh``) when the module carries its config."""
    if isinstance(module, DenseReluGatedMLP):
        return "relu"
    name = _activation_name(module.act_fn)
    hidden_act = getattr(getattr(module, "config", None), "hidden_act", None)
    if name not in ("relu", "silu") and isinstance(hidden_act, str):
        return hidden_act
    return name


def _check_projections(name: str, module: nn.Module) -> tuple[int, int]:
    """``(d, F)`` of a gated MLP, refusing biases, non-float (quantised) weights and inconsistent shapes."""
    g, u, dn = (getattr(module, p) for p in _PROJ)
    for p, lin in zip(_PROJ, (g, u, dn), strict=True):
        if lin.bias is not None:
            raise ValueError(f"{name}.{p} has a bias; SparseGatedMLP has none, so {name} cannot be converted")
        if not lin.weight.is_floating_point() or lin.weight.dtype not in (
            torch.float16,
            torch.bfloat16,
            torch.float32,
            torch.float64,
        ):
            raise TypeError(
                f"{name}.{p}.weight has dtype {lin.weight.dtype}; only unquantised float16/bfloat16/float32/float64 "
                "weights can be converted"
            )
    f, d = g.weight.shape
    if tuple(u.weight.shape) != (f, d) or tuple(dn.weight.shape) != (d, f):
        raise ValueError(
            f"{name} has inconsistent projections: gate_proj {tuple(g.weight.shape)}, up_proj {tuple(u.weight.shape)}, "
            f"down_proj {tuple(dn.weight.shape)}; expected [F, d], [F, d], [d, F]"
        )
    dtypes = {lin.weight.dtype for lin in (g, u, dn)}
    devices = {lin.weight.device for lin in (g, u, dn)}
    if len(dtypes) > 1 or len(devices) > 1:
        raise ValueError(f"{name}: gate/up/down weights must share one dtype and device, got {dtypes} on {devices}")
    return d, f


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _shell(cls: type[nn.Module], d: int, f: int, like: nn.Module, **kwargs: Any) -> nn.Module:
    """A ``cls(d, f)`` built on the meta device (no allocation), then given ``like``'s three Linear modules."""
    new = cls(d, f, device="meta", **kwargs)
    for p in _PROJ:
        setattr(new, p, getattr(like, p))
    return new.train(like.training)


# ---------------------------------------------------------------------------------------------- apply / revert
def apply(model: nn.Module, *, allow_silu: bool = False, **mlp_kwargs: Any) -> ConversionReport:
    """Convert every gated MLP of ``model`` in place into a :class:`SparseGatedMLP` sharing its weights.

    Args:
        model: any ``nn.Module`` (typically a transformers Llama/Qwen2 model).
        allow_silu: also convert SiLU-gated MLPs (the model then computes with ReLU: for sparse
            fine-tuning, not for inference of the original model).
        **mlp_kwargs: :class:`SparseGatedMLP` options (``backend``, ``tile``, ``capacity``,
            ``precision``, ``policy``, ``l0_refresh_every``, ``eager_graphs``).

    Everything is checked before anything is changed: a refused model is left untouched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(allow_silu, bool):
        raise TypeError(f"allow_silu must be a bool, got {type(allow_silu).__name__}")
    bad = sorted(set(mlp_kwargs) - set(_MLP_KWARGS))
    if bad:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(bad)}; SparseGatedMLP options are {', '.join(_MLP_KWARGS)} "
            "(device and dtype come from the model's weights)"
        )
    candidates = [(n, m) for n, m in model.named_modules() if n and _is_gated_mlp(m)]
    if not candidates:
        n_sparse = sum(isinstance(m, SparseGatedMLP) for m in model.modules())
        hint = f" ({n_sparse} SparseGatedMLP already present)" if n_sparse else ""
        raise ValueError(
            f"{type(model).__name__} has no gated MLP to convert{hint}: twell.models.apply looks for modules with "
            "nn.Linear children gate_proj, up_proj, down_proj and an act_fn (Llama/Qwen2-family MLPs)"
        )
    plan = []
    refused: dict[str, list[str]] = {}
    for name, mod in candidates:
        act = _module_activation(mod)
        if act != "relu" and not (allow_silu and act == "silu"):
            refused.setdefault(act, []).append(name)
        plan.append((name, mod, act, _check_projections(name, mod)))
    if refused:
        parts = [f"{act!r} in {len(names)} module(s) (e.g. {names[0]})" for act, names in refused.items()]
        only_silu = set(refused) == {"silu"}
        raise ValueError(
            "refusing to convert: the MLP activation is " + "; ".join(parts) + ". SparseGatedMLP computes a ReLU "
            "gate, so converting would change what the model computes. "
            + (
                "Pass allow_silu=True to convert anyway for sparse fine-tuning (the model then computes with ReLU)."
                if only_silu
                else "Only ReLU (and, with allow_silu=True, SiLU) gated MLPs can be converted."
            )
        )
    # Build every replacement first (constructor checks of mlp_kwargs may raise), then swap.
    replacements = []
    for name, mod, act, (d, f) in plan:
        dtype = mod.gate_proj.weight.dtype
        new = _shell(SparseGatedMLP, d, f, mod, dtype=dtype, **mlp_kwargs)
        object.__setattr__(new, _ORIGINAL_ATTR, mod)
        replacements.append((name, new, ConvertedModule(name, d, f, type(mod).__name__, act, type(new).__name__)))
    for name, new, _ in replacements:
        _set_submodule(model, name, new)

    report = ConversionReport("apply", [info for _, _, info in replacements])
    report.causal_mask_backbones = causal_mask.enable(model)
    if report.activation_changed:
        acts = sorted(report.original_activations - {"relu"})
        report.notes.append(
            f"original activation {', '.join(acts)} replaced by ReLU (allow_silu=True): the converted model computes "
            "a different function until it is fine-tuned"
        )
        config = getattr(model, "config", None)
        if config is not None and getattr(config, "hidden_act", "relu") != "relu":
            object.__setattr__(model, _ORIGINAL_ACT_ATTR, config.hidden_act)
            report.notes.append(f"config.hidden_act changed from {config.hidden_act!r} to 'relu'")
            config.hidden_act = "relu"
    return report


def revert(model: nn.Module) -> ConversionReport:
    """Turn every :class:`SparseGatedMLP` of ``model`` back into a dense MLP sharing its weights.

    The module :func:`apply` replaced is restored when it was recorded (its activation included, e.g. SiLU
    after an ``allow_silu`` conversion); otherwise a :class:`DenseReluGatedMLP` is built.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    targets = [(n, m) for n, m in model.named_modules() if n and isinstance(m, SparseGatedMLP)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no SparseGatedMLP to revert")
    report = ConversionReport("revert")
    restored_non_relu = False
    for name, sparse in targets:
        original = sparse.__dict__.get(_ORIGINAL_ATTR)
        d, f = sparse.hidden_size, sparse.intermediate_size
        if original is not None:
            for p in _PROJ:  # re-attach the current Linear modules (they may have been replaced meanwhile)
                setattr(original, p, getattr(sparse, p))
            new = original.train(sparse.training)
            act = _module_activation(new)
            restored_non_relu |= act != "relu"
        else:
            dtype = sparse.gate_proj.weight.dtype
            new = _shell(DenseReluGatedMLP, d, f, sparse, dtype=dtype)
            act = "relu"
        _set_submodule(model, name, new)
        report.modules.append(ConvertedModule(name, d, f, "SparseGatedMLP", act, type(new).__name__))
    report.causal_mask_backbones = causal_mask.disable(model)
    if restored_non_relu:
        report.notes.append("original non-ReLU MLPs restored: the model computes with its original activation again")
    old_act = model.__dict__.pop(_ORIGINAL_ACT_ATTR, None)
    config = getattr(model, "config", None)
    if old_act is not None and config is not None and restored_non_relu:
        config.hidden_act = old_act
        report.notes.append(f"config.hidden_act restored to {old_act!r}")
    return report
