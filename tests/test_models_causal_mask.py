"""twell.models.causal_mask: the twell models, and models converted with twell.models.apply, hand SDPA no causal mask
where the call proves it causal, in eager and compiled forwards, with the same logits; every other call (padding
masks, cached positions, explicit position ids, other models, converted models after revert) keeps transformers' mask.

The GPU machines' transformers (5.17, torch 2.11) never skip the mask while tracing; the development machine's newer
one does where no padding mask is given.  The tests take the GPU's case by making transformers' own skip test answer
False, as it does there, and spy on the mask the attention receives.  A backbone called with ``use_cache=False``
gets transformers' packed-sequence check under tracing on both (rule 2 of the module).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="twell.models needs the hf extra")
from test_models_hf import FAMILIES, _dense_twin, _ids, _twell_model  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

from twell.models import apply, causal_mask, revert  # noqa: E402
from twell.tolerances import FP32_ELEMENT_TOL, FP32_UNIT_ABS_TOL  # noqa: E402


@pytest.fixture
def masks_seen(monkeypatch) -> list[bool]:
    """For each attention call, whether SDPA was given no mask; transformers' own skip test forced to False (the
    GPU machines' transformers while tracing)."""
    seen: list[bool] = []
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append(attention_mask is None)
        return original(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", spy)
    monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", lambda *a, **k: False)
    return seen


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kwargs).logits


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=FP32_ELEMENT_TOL, atol=FP32_UNIT_ABS_TOL)


def test_install_wraps_once():
    wrapped = mu.AttentionMaskInterface._global_mapping["sdpa"]
    packed = mu.find_packed_sequence_indices
    assert hasattr(wrapped, "_twell_causal_skip_wraps") and hasattr(packed, "_twell_causal_skip_wraps")
    causal_mask.install()
    assert mu.AttentionMaskInterface._global_mapping["sdpa"] is wrapped and mu.find_packed_sequence_indices is packed


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_no_mask_for_a_whole_sequence_same_logits(family, masks_seen, monkeypatch):
    """A forward over whole sequences without a padding mask: SDPA gets no mask (is_causal) in every layer, and the
    logits are those of the materialised mask (the rule off)."""
    model = _twell_model(family, attn_implementation="sdpa").eval()
    ids = _ids(2, 9)
    got = _logits(model, ids)
    assert masks_seen and all(masks_seen)
    masks_seen.clear()
    monkeypatch.setattr(causal_mask, "SKIP_TRACED_CAUSAL_MASK", False)
    want = _logits(model, ids)
    assert masks_seen and not any(masks_seen)
    assert _close(got, want)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_no_mask_under_torch_compile(family, masks_seen, monkeypatch):
    """Both rules read Python values and shapes only, so a compiled forward without a cache (the packed-sequence check
    on transformers' side) takes them in one graph; with them off the compiled forward gets a materialised mask."""
    model = _twell_model(family, attn_implementation="sdpa").eval()
    ids = _ids(2, 12)
    want = _logits(model, ids, use_cache=False)
    for skip in (True, False):
        monkeypatch.setattr(causal_mask, "SKIP_TRACED_CAUSAL_MASK", skip)
        torch._dynamo.reset()
        masks_seen.clear()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: no graph break
        got = _logits(compiled, ids, use_cache=False)
        assert masks_seen and all(m == skip for m in masks_seen), (skip, masks_seen)
        assert _close(got, want)
    assert causal_mask._own_positions is False  # cleared after each call


def test_explicit_positions_keep_the_mask_under_compile(masks_seen):
    """Position ids given by the caller may pack several sequences in a row: transformers' check decides (under
    tracing: a materialised mask)."""
    model = _twell_model("llama", attn_implementation="sdpa").eval()
    ids = _ids(2, 12)
    pos = torch.cat([torch.arange(5), torch.arange(7)]).expand(2, -1)  # two packed sequences a row
    want = _logits(model, ids, position_ids=pos, use_cache=False)
    torch._dynamo.reset()
    masks_seen.clear()
    got = _logits(torch.compile(model, backend="aot_eager"), ids, position_ids=pos, use_cache=False)
    assert masks_seen and not any(masks_seen)
    assert _close(got, want)


def test_mark_cleared_when_the_forward_raises():
    model = _twell_model("llama").eval()
    with pytest.raises(IndexError):
        model.model(input_ids=torch.full((1, 4), 10_000))  # ids past the vocabulary: the embedding raises
    assert causal_mask._own_positions is False


def test_padding_mask_and_cached_positions_keep_the_mask(masks_seen):
    """A padding mask (left padding, whose values a traced graph cannot read) and a decoding step after cached
    positions (the query shorter than the keys) go to transformers' mask function: masks are materialised."""
    model = _twell_model("llama", attn_implementation="sdpa").eval()
    ids = _ids(2, 8)
    pad = torch.ones_like(ids)
    pad[0, :3] = 0
    _logits(model, ids, attention_mask=pad)
    assert masks_seen and not any(masks_seen)
    masks_seen.clear()
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :6], past_key_values=cache, use_cache=True)  # prefill: the whole sequence, no mask
        assert masks_seen and all(masks_seen)
        masks_seen.clear()
        model(ids[:, 6:], past_key_values=cache, use_cache=True)  # two new tokens after six cached ones
    assert masks_seen and not any(masks_seen)


def test_other_models_keep_the_mask(masks_seen):
    """transformers' own Llama (not a twell config) is left to transformers' rule."""
    dense = _dense_twin(_twell_model("llama", attn_implementation="sdpa"), "llama").eval()
    assert not isinstance(dense.config, FAMILIES["llama"][0])
    _logits(dense, _ids(2, 9))
    assert masks_seen and not any(masks_seen)


def test_causal_skip_applies_rules():
    cfg = _twell_model("llama").config
    base = {"allow_is_causal_skip": True, "attention_mask": None, "q_length": 5, "kv_length": 5, "kv_offset": 0}
    assert causal_mask.causal_skip_applies(cfg, base)
    assert causal_mask.causal_skip_applies(cfg, {**{k: v for k, v in base.items() if k != "q_length"},
                                                 "cache_position": torch.arange(5)})  # the earlier 5.x argument
    for change in ({"allow_is_causal_skip": False}, {"attention_mask": torch.ones(1, 5, dtype=torch.bool)},
                   {"kv_length": 7}, {"kv_offset": 2}, {"local_size": 4}, {"q_length": None}):
        assert not causal_mask.causal_skip_applies(cfg, {**base, **change}), change
    assert not causal_mask.causal_skip_applies(object(), base)


def test_sliding_window_kept_under_compile(masks_seen):
    """Qwen2 with a sliding window (every layer, window 4 of 12 positions): rule 1 leaves windowed masks to
    transformers (``local_size``), so the compiled forward gives the eager logits, which differ from full attention."""
    windowed = _twell_model("qwen2", attn_implementation="sdpa", use_sliding_window=True, sliding_window=4,
                            max_window_layers=0).eval()
    assert set(windowed.config.layer_types) == {"sliding_attention"}
    ids = _ids(2, 12)
    want = _logits(windowed, ids, use_cache=False)
    torch._dynamo.reset()
    masks_seen.clear()
    got = _logits(torch.compile(windowed, backend="aot_eager"), ids, use_cache=False)
    assert masks_seen and not any(masks_seen)  # the window's mask, materialised
    assert _close(got, want)
    full = _logits(_twell_model("qwen2", attn_implementation="sdpa").eval(), ids, use_cache=False)
    assert not _close(full, want)


# ---------------------------------------------------------------------------------------------- converted models
def _converted(family: str) -> torch.nn.Module:
    """transformers' own model (ReLU gate, SDPA) converted in place by twell.models.apply."""
    dense = _dense_twin(_twell_model(family, attn_implementation="sdpa"), family).eval()
    report = apply(dense, backend="torch", tile=32)
    assert report.causal_mask_backbones == ["model"], report.causal_mask_backbones
    assert "causal-mask rules (SDPA is_causal in compiled/recorded forwards) on for: model" in str(report)
    return dense


def _compiled_masks(model: torch.nn.Module, ids: torch.Tensor, masks_seen: list[bool]
                    ) -> tuple[list[bool], torch.Tensor]:
    """Which attention calls of a fresh fullgraph compile (no cache) got no mask, and its logits."""
    torch._dynamo.reset()
    masks_seen.clear()
    logits = _logits(torch.compile(model, backend="aot_eager", fullgraph=True), ids, use_cache=False)
    return list(masks_seen), logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_converted_model_gets_both_rules_and_revert_takes_them_off(family, masks_seen):
    """A model converted with twell.models.apply keeps transformers' config class, yet its compiled forward without a
    cache hands SDPA no mask, with the eager logits; after revert its compiled forward gets transformers' mask."""
    model = _converted(family)
    ids = _ids(2, 12)
    want = _logits(model, ids, use_cache=False)
    seen, got = _compiled_masks(model, ids, masks_seen)
    assert seen and all(seen), seen
    assert _close(got, want)
    assert causal_mask._own_positions is False and causal_mask._in_converted_backbone is False

    back = revert(model)
    assert back.causal_mask_backbones == ["model"] and "off for: model" in str(back)
    seen, got = _compiled_masks(model, ids, masks_seen)
    assert seen and not any(seen), seen
    assert _close(got, want)
    again = apply(model, backend="torch", tile=32)  # and on again: the hooks registered once, the rules back
    assert again.causal_mask_backbones == ["model"]
    assert len(model.model._forward_pre_hooks) == 1 and len(model.model._forward_hooks) == 1
    seen, _ = _compiled_masks(model, ids, masks_seen)
    assert seen and all(seen), seen


def test_converted_model_rule_1_with_a_cache(masks_seen):
    """Eagerly with transformers' skip test answering False (as while tracing on the GPU machines): a converted model's
    prefill into a cache gets no mask (rule 1), its decoding step after cached positions gets transformers' mask."""
    model = _converted("llama")
    ids = _ids(2, 8)
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :6], past_key_values=cache, use_cache=True)
        assert masks_seen and all(masks_seen)
        masks_seen.clear()
        model(ids[:, 6:], past_key_values=cache, use_cache=True)
    assert masks_seen and not any(masks_seen)
    masks_seen.clear()
    pad = torch.ones_like(ids)
    pad[0, :2] = 0
    _logits(model, ids, attention_mask=pad)
    assert masks_seen and not any(masks_seen)


def test_converted_model_saves_the_checkpoint_it_would_without_the_rules(tmp_path):
    """Nothing of the rules reaches the config or the state dict: the saved config.json is the unconverted model's."""
    plain = _dense_twin(_twell_model("llama", attn_implementation="sdpa"), "llama")
    plain.save_pretrained(tmp_path / "plain")
    model = _converted("llama")
    model.save_pretrained(tmp_path / "converted")
    assert (tmp_path / "plain" / "config.json").read_text() == (tmp_path / "converted" / "config.json").read_text()
    assert "twell" not in (tmp_path / "converted" / "config.json").read_text()
    assert not any("twell" in k for k in model.state_dict())


def test_deep_copy_keeps_the_rules_independently(masks_seen):
    """A deep copy carries the rules with its own hooks: reverting the copy leaves the original's on."""
    model = _converted("llama")
    twin = copy.deepcopy(model)
    assert revert(twin).causal_mask_backbones == ["model"]
    ids = _ids(2, 10)
    seen, _ = _compiled_masks(model, ids, masks_seen)
    assert seen and all(seen)
    seen, _ = _compiled_masks(twin, ids, masks_seen)
    assert seen and not any(seen)


def test_twell_model_keeps_its_rules_through_revert_and_apply(masks_seen):
    """A twell model's backbone has its own rules: revert does not list or remove them, apply does not re-enable."""
    model = _twell_model("llama", attn_implementation="sdpa").eval()
    back = revert(model)
    assert back.causal_mask_backbones == []
    seen, _ = _compiled_masks(model, _ids(2, 9), masks_seen)
    assert seen and all(seen)
    assert apply(model, backend="torch", tile=32).causal_mask_backbones == []


def test_other_architectures_get_no_rules():
    """apply converts any module with the three projections and an act_fn; the rules need a Llama/Qwen2 backbone."""

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(8, 32, bias=False), torch.nn.Linear(8, 32, bias=False)
            self.down_proj, self.act_fn = torch.nn.Linear(32, 8, bias=False), torch.nn.ReLU()

    model = torch.nn.Sequential(Mlp())
    report = apply(model, backend="torch", tile=32)
    assert len(report) == 1 and report.causal_mask_backbones == []
    assert "causal-mask" not in str(report)
    assert revert(model).causal_mask_backbones == []
