"""Tier 3: build the kernels for sm_90 (Hopper) on a machine without a GPU.

Catches compile errors the interpreter cannot see, checks that the gate GEMM is lowered to Hopper's
wgmma tensor-core instructions, and that no kernel spills to local memory.  Runs in a subprocess
because this test session sets TRITON_INTERPRET=1, which replaces the kernels by Python functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-m", "twell.ops.compile_check", "90"], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tensor_core_kernels_use_wgmma(compiled):
    for name in ("gate_epilogue0", "gate_epilogue2", "union_up", "union_down"):
        assert compiled[name]["wgmma"], name


def test_no_kernel_uses_local_memory(compiled):
    assert set(compiled) == {
        "gate_epilogue0", "gate_epilogue2", "pack", "ffn_gated1_spill0_split0", "ffn_gated0_spill1_split0",
        "ffn_gated1_spill0_split1", "hot_hidden", "pack_bitmap", "bitmap_ffn", "block_union", "union_up", "union_down",
        "train_pack_rows", "train_forward_rows", "train_backward_rows", "train_unit_grads", "decode_hidden_bm16",
        "decode_hidden_bm16_gate_in", "decode_down_bm16", "decode_hidden_bm64", "decode_hidden_bm64_gate_in",
        "decode_down_bm64", "decode_onepass_bm1", "decode_onepass_bm8", "decode_column_sum",
    }
    spilled = [name for name, r in compiled.items() if r["local_memory"]]
    assert spilled == []
