"""Machinery shared by the twell Llama and Qwen2 models: config options, MLP replacement, the L1 term.

Everything here is written against the public surface of transformers 5.x that did not move between
the minor releases (``PreTrainedConfig.__init__(**kwargs)``, ``ModelOutput`` dataclasses, the
``forward(**kwargs)`` of the causal-LM classes), because the GPU machines run an older 5.x than the
development machine.  In particular:

* the causal-LM ``forward`` is wrapped with ``*args, **kwargs`` and ``functools.wraps`` (so that
  ``generate``, which inspects the signature, still sees the parent's parameters), because the
  names of some parameters changed inside 5.x (``past_key_values`` became ``cache``);
* the returned output is rebuilt from the parent's output *by its keys*, so whatever fields the
  installed version has are kept, and two fields are added (:class:`TwellCausalLMOutput`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..format.twell import DEFAULT_TILE, MAX_TILE
from ..nn import DispatchPolicy, SparseGatedMLP
from ..nn.train_dispatch import DEFAULT_TRAIN_POLICY, TrainDispatchPolicy
from ..ops._runtime import BACKENDS
from ..ops.inference import PRECISIONS, TRITON_TILES

__all__ = [
    "TWELL_CONFIG_DEFAULTS",
    "TwellCausalLMOutput",
    "iter_sparse_mlps",
    "set_dispatch_policy",
    "set_train_dispatch_policy",
]

#: The twell options every twell config carries, with their defaults.  ``l1_coef`` 2e-5 is the
#: published coefficient (1.5B model: 29 of 5632 units active per token, no accuracy loss).
TWELL_CONFIG_DEFAULTS: dict[str, Any] = {
    "twell_backend": "auto",
    "twell_tile": DEFAULT_TILE,
    "twell_capacity": None,
    "twell_precision": "match",
    "l1_coef": 2e-5,
}


def check_twell_options(
    *, twell_backend: object, twell_tile: object, twell_capacity: object, twell_precision: object, l1_coef: object
) -> None:
    """Validate the config's twell options with messages naming the option (at config time, not deep in a forward).

    The tile is checked against the Triton tiles unless the backend is ``"torch"``, exactly as
    :class:`~twell.nn.SparseGatedMLP` does, so a config that saves also builds.
    """
    if twell_backend not in BACKENDS:
        raise ValueError(f"twell_backend must be one of {', '.join(BACKENDS)}; got {twell_backend!r}")
    if twell_precision not in PRECISIONS:
        raise ValueError(f"twell_precision must be one of {', '.join(PRECISIONS)}; got {twell_precision!r}")
    if isinstance(twell_tile, bool) or not isinstance(twell_tile, int) or not 0 < twell_tile <= MAX_TILE:
        raise ValueError(f"twell_tile must be an int in [1, {MAX_TILE}]; got {twell_tile!r}")
    if twell_backend != "torch" and twell_tile not in TRITON_TILES:
        raise ValueError(
            f"twell_tile={twell_tile} is not one the Triton kernels take {TRITON_TILES} "
            f"(twell_backend={twell_backend!r}); pick one of those or use twell_backend='torch'"
        )
    if twell_capacity is not None and (
        isinstance(twell_capacity, bool) or not isinstance(twell_capacity, int) or not 0 < twell_capacity <= twell_tile
    ):
        raise ValueError(
            f"twell_capacity must be None or an int in [1, twell_tile={twell_tile}]; got {twell_capacity!r}"
        )
    if isinstance(l1_coef, bool) or not isinstance(l1_coef, (int, float)) or not math.isfinite(l1_coef) or l1_coef < 0:
        raise ValueError(f"l1_coef must be a finite float >= 0; got {l1_coef!r}")


def normalise_twell_options(explicit: dict[str, Any]) -> dict[str, Any]:
    """The twell options (the config's named arguments), validated, an int ``l1_coef`` made a float."""
    opts = dict(explicit)
    if isinstance(opts["l1_coef"], int) and not isinstance(opts["l1_coef"], bool):
        opts["l1_coef"] = float(opts["l1_coef"])
    check_twell_options(**opts)
    return opts


def check_relu_act(hidden_act: object, config_name: str) -> str:
    """The twell models compute a ReLU gate; any other ``hidden_act`` is refused (it would be silently ignored)."""
    if hidden_act != "relu":
        raise ValueError(
            f"{config_name} computes a ReLU-gated FFN, so hidden_act must be 'relu'; got {hidden_act!r}. "
            "To sparsify a model trained with another activation (e.g. SiLU) use "
            "twell.models.apply(model, allow_silu=True) and fine-tune it with the L1 penalty."
        )
    return hidden_act


def mlp_kwargs_from_config(config: Any) -> dict[str, Any]:
    """The :class:`SparseGatedMLP` keyword arguments a twell config describes."""
    return {
        "backend": config.twell_backend,
        "tile": config.twell_tile,
        "capacity": config.twell_capacity,
        "precision": config.twell_precision,
    }


def sparsify_layers(layers: nn.ModuleList, config: Any) -> None:
    """Replace each decoder layer's ``mlp`` by a fresh :class:`SparseGatedMLP` (same parameter names).

    The new MLP is built on the device and dtype of the one it replaces (meta while
    ``from_pretrained`` builds the skeleton, so nothing is allocated twice there); its weights are
    initialised by the caller's ``post_init`` (transformers initialises every module that does not
    carry its ``_is_hf_initialized`` flag yet, i.e. exactly the new ones).
    """
    kwargs = mlp_kwargs_from_config(config)
    for i, layer in enumerate(layers):
        old = layer.mlp
        if getattr(old, "gate_proj", None) is None or not hasattr(old, "up_proj"):
            raise TypeError(f"decoder layer {i} has an mlp of type {type(old).__name__}, not a gated MLP")
        w = old.gate_proj.weight
        if getattr(old.gate_proj, "bias", None) is not None:
            raise ValueError(
                f"decoder layer {i}: the config asks for MLP biases (mlp_bias=True); the sparse FFN has none"
            )
        layer.mlp = SparseGatedMLP(
            config.hidden_size, config.intermediate_size, device=w.device, dtype=w.dtype, **kwargs
        ).train(old.training)


def iter_sparse_mlps(model: nn.Module) -> Iterator[tuple[str, SparseGatedMLP]]:
    """``(qualified name, module)`` for every :class:`SparseGatedMLP` inside ``model``, in module order."""
    for name, module in model.named_modules():
        if isinstance(module, SparseGatedMLP):
            yield name, module


def set_dispatch_policy(model: nn.Module, policy: DispatchPolicy | None) -> int:
    """Give every :class:`SparseGatedMLP` of ``model`` the dispatch ``policy`` (None: the default); return the count.

    The policy is not part of the config (it is a measured table, specific to a GPU and dtype), so it is
    set on the live model instead.  Each layer's density estimate is reset, since a new policy may
    need the measurement the old one never made.
    """
    from ..nn.dispatch import DEFAULT_POLICY

    if policy is None:
        policy = DEFAULT_POLICY
    if not isinstance(policy, DispatchPolicy):
        raise TypeError(f"policy must be a twell.nn.DispatchPolicy or None, got {type(policy).__name__}")
    n = 0
    for _, mlp in iter_sparse_mlps(model):
        mlp.policy = policy
        mlp.reset_l0_estimate()
        n += 1
    return n


def set_train_dispatch_policy(model: nn.Module, policy: TrainDispatchPolicy | None) -> int:
    """Give every :class:`SparseGatedMLP` of ``model`` the training dispatch ``policy`` of ``train_impl="auto"`` (None:
    :data:`~twell.nn.train_dispatch.DEFAULT_TRAIN_POLICY`); return the count.  A measured table is specific to a GPU
    and dtype (``twell bench train-ffn --sparse-impl hot-cold`` writes one, :func:`twell.nn.load_train_policy` reads
    it), so like the inference policy it is set on the live model; each layer's training switch starts over (its l0
    estimate too), since the new table may need the read the old one skipped."""
    if policy is None:
        policy = DEFAULT_TRAIN_POLICY
    if not isinstance(policy, TrainDispatchPolicy):
        raise TypeError(f"policy must be a twell.nn.train_dispatch.TrainDispatchPolicy or None, "
                        f"got {type(policy).__name__}")
    n = 0
    for _, mlp in iter_sparse_mlps(model):
        mlp.train_policy = policy
        mlp._train_switch.reset()
        n += 1
    return n


@dataclass
class TwellCausalLMOutput(CausalLMOutputWithPast):
    """:class:`~transformers.modeling_outputs.CausalLMOutputWithPast` plus the sparsity statistics.

    Attributes (besides the parent's):
        l1_loss: mean over the sparse layers of each layer's L1 penalty (mean over tokens of
            ``sum_j |h_j|``, the published normalisation); differentiable; None unless the forward ran
            in training mode with grad enabled.  ``loss`` already contains ``l1_coef * l1_loss`` when
            labels were given.
        layer_l0: float32 tensor ``[n_sparse_layers]``, the mean number of active units per token of
            each layer measured during this forward, NaN for a layer that did not measure it (in
            inference the dense path measures only every ``l0_refresh_every`` calls); None when the
            model has no sparse layer.
    """

    l1_loss: torch.FloatTensor | None = None
    layer_l0: torch.FloatTensor | None = None


def wrap_causal_lm_forward(parent_forward: Callable[..., Any]) -> Callable[..., Any]:
    """A ``forward`` for a twell causal LM that calls ``parent_forward`` and adds the L1 term and l0 statistics.

    ``functools.wraps`` keeps the parent's signature visible to ``inspect.signature`` (``generate``
    decides from it which inputs to pass).
    """

    @functools.wraps(parent_forward)
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return_dict = kwargs.pop("return_dict", None)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        mlps = [m for _, m in iter_sparse_mlps(self)]
        # Clear what a previous forward left, so nothing stale is reported as this call's statistics.
        for m in mlps:
            m.last_l1 = None
            m.last_l0 = None
        out = parent_forward(self, *args, return_dict=True, **kwargs)
        l1_loss, layer_l0 = collect_sparsity(self, mlps, out.logits.device)
        fields = dict(out.items())
        if l1_loss is not None:
            coef = float(self.config.l1_coef)
            if fields.get("loss") is not None and coef != 0.0:
                fields["loss"] = fields["loss"] + coef * l1_loss.to(fields["loss"].dtype)
        result = TwellCausalLMOutput(**fields, l1_loss=l1_loss, layer_l0=layer_l0)
        return result if return_dict else result.to_tuple()

    forward.__doc__ = (
        "The parent causal LM's forward; in training mode (grad enabled) ``loss`` also contains "
        "``config.l1_coef * l1_loss``.  Returns a :class:`twell.models.TwellCausalLMOutput` "
        "(``l1_loss``, ``layer_l0``)."
    )
    return forward


def collect_sparsity(
    model: nn.Module, mlps: list[SparseGatedMLP], device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(l1_loss, layer_l0)`` from the sparse MLPs after a forward (see :class:`TwellCausalLMOutput`).

    In training mode with grad enabled every sparse MLP must have produced its L1 term; when one did
    not (reentrant gradient checkpointing runs the forward under ``no_grad``), the loss would silently
    lack the penalty, so this raises instead.
    """
    if not mlps:
        return None, None
    # At most two small device ops per forward (one NaN scalar, one stack): this runs every decode step.
    measured = [m.last_l0 for m in mlps]
    if all(v is None for v in measured):
        layer_l0 = torch.full((len(mlps),), float("nan"), device=device)
    else:
        nan = torch.full((), float("nan"), device=device)
        layer_l0 = torch.stack([nan if v is None else v.to(device=device, dtype=torch.float32) for v in measured])
    if not (model.training and torch.is_grad_enabled()):
        return None, layer_l0
    missing = [i for i, m in enumerate(mlps) if m.last_l1 is None]
    if missing:
        if len(missing) == len(mlps) and all(not m.training for m in mlps):
            return None, layer_l0  # the MLPs were put in eval mode on purpose
        raise RuntimeError(
            f"sparse layers {missing} produced no L1 term in this training forward: they ran without grad "
            "(reentrant gradient checkpointing does that) or in eval mode. Enable checkpointing with "
            "gradient_checkpointing_kwargs={'use_reentrant': False} (the default) and keep the MLPs in training mode."
        )
    # Float32 (float64 for a float64 model), as the layers return it; all layers share the model's dtype.
    dtype = mlps[0].last_l1.dtype  # type: ignore[union-attr]
    l1_loss = torch.stack([m.last_l1.to(device=device, dtype=dtype) for m in mlps]).mean()  # type: ignore[union-attr]
    return l1_loss, layer_l0


def set_twell_options(config: Any, hidden_act: object, options: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Check the ReLU activation and the twell options and set them on ``config`` before its parent's
    ``__init__`` runs (plain attributes: the form both dataclass-style and ``__init__``-style transformers
    5.x configs accept, written to config.json by ``to_dict``); drops a serialised ``model_type``."""
    check_relu_act(hidden_act, type(config).__name__)
    for key, value in normalise_twell_options(options).items():
        setattr(config, key, value)
    kwargs.pop("model_type", None)  # written by to_dict; the class attribute is the truth
