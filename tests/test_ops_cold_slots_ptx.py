"""The PTX text of the fused gate's thread-by-thread cold epilogue (twell.ops.cold_slots_ptx): operands,
labels, caching and refusals.  Its results are checked on the GPU, against the Triton epilogues and the
three unfused kernels, by tests/test_ops_hot_cold_gate.py (the interpreter runs no PTX)."""

from __future__ import annotations

import re

import pytest

from twell.ops.cold_slots_ptx import cold_slots_asm
from twell.ops.hot_cold_gate_kernel import ptx_slots_supported

CONFIGS = [(256, 128, 16, 128, True, "bf16"), (256, 128, 16, 128, False, "f16"), (128, 64, 8, 64, True, "bf16")]


@pytest.mark.parametrize("bn, tile, cap, pack, map_ids, half", CONFIGS)
def test_operands_and_labels(bn, tile, cap, pack, map_ids, half):
    text, constraints = cold_slots_asm(bn, tile, cap, pack, map_ids, half)
    kinds = constraints.split(",")
    n_out, n_act = pack // 4, pack // 2
    assert kinds == ["=r"] * n_out + ["r"] * n_act + ["r"] * pack + ["l"] * (4 * pack)
    used = {int(n) for n in re.findall(r"\$(\d+)", text)}
    assert max(used) < len(kinds)
    assert set(range(n_out)) <= used  # every dummy output written
    assert set(range(n_out, n_out + n_act)) <= used  # every register of the thread's elements read
    assert "$A" not in text  # every act placeholder replaced
    # each label defined once, inside the asm's own brace scope
    labels = re.findall(r"^(\w+):$", text, flags=re.M)
    assert len(labels) == len(set(labels)) and text.startswith("{") and text.endswith("}")
    assert f"set.gtu.u32.{half}x2" in text
    assert ("ld.global.b32" in text) == map_ids  # the unit map read only for weight-row ids


def test_cached_text_is_the_same_object():
    a = cold_slots_asm(*CONFIGS[0])
    b = cold_slots_asm(*CONFIGS[0])
    assert a[0] is b[0] and a[1] is b[1]


def test_refusals():
    with pytest.raises(ValueError, match="bn = tile or 2 \\* tile"):
        cold_slots_asm(256, 64, 8, 128, True, "bf16")
    with pytest.raises(ValueError, match="tile a multiple of 8 up to 128"):
        cold_slots_asm(512, 256, 16, 256, True, "bf16")
    with pytest.raises(ValueError, match="2 rows x 64 columns = 128 elements, got pack=64"):
        cold_slots_asm(256, 128, 16, 64, True, "bf16")
    with pytest.raises(ValueError, match="half must be 'bf16' or 'f16', got 'f32'"):
        cold_slots_asm(256, 128, 16, 128, True, "f32")


def test_ptx_slots_only_under_the_checked_triton_release():
    assert ptx_slots_supported("3.6.0") and ptx_slots_supported("3.6.1")
    assert not ptx_slots_supported("3.7.0") and not ptx_slots_supported("3.5.1") and not ptx_slots_supported("3.60.0")
