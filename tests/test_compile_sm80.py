"""Tier 3 for GPUs before Hopper: build, for sm_80 (A100) on a machine without a GPU, the kernels that twell
launches there, as it launches them there, and check that each fits the shared memory of those cards.

Below compute capability 9.0 the launchers take no programmatic dependent launch (``griddepcontrol``, which ptxas
rejects for sm_80) and no kernel that loads through TMA descriptors (the fused hot/cold gate, the cold-down GEMM):
``twell.ops._runtime.pdl_supported`` / ``tma_capable`` keep them off, and ``compile_check.check(80)`` builds the
rest so.  The 8.6 and 8.9 cards (A10, A40, RTX 30xx / 40xx, L4, L40) compile through the same sm_80 lowering
(mma.sync, cp.async) but give a program 99 KB of shared memory against the A100's 163 KB, so the test holds every
build to the smaller limit too.  Runs in a subprocess because this test session sets TRITON_INTERPRET=1.
"""

from __future__ import annotations

import pytest
from test_compile_sm90 import SM90_KERNELS, compile_check_entries

from twell.ops.compile_check import SHARED_MEMORY_LIMIT_BYTES

#: Kernels that take TMA descriptors or wait as programmatic dependents in every build: never launched below sm_90.
HOPPER_ONLY = {"hot_cold_gate_t128", "hot_cold_gate_t64", "hot_cold_gate_t128_counted", "down_cold",
               "list_rows_heavy_first_pdl", "ffn_gated1_spill0_split1_ids_listed_heavy_first_pdl",
               "list_rows_heavy_first_beside_gate"}


@pytest.fixture(scope="module")
def compiled() -> dict:
    return compile_check_entries(80)


def test_every_kernel_but_the_hopper_ones_builds_for_sm80(compiled):
    assert HOPPER_ONLY <= SM90_KERNELS
    assert set(compiled) == SM90_KERNELS - HOPPER_ONLY


def test_no_programmatic_dependent_wait_below_sm90(compiled):
    """Built as launched there: the batch decode kernels without griddepcontrol (ptxas rejects it for sm_80)."""
    waits = {name for name, r in compiled.items() if r.get("griddepcontrol")}
    assert waits == set()
    assert {"batch_up_bm16", "batch_down_bm64", "batch_partial_sum"} <= set(compiled)


@pytest.mark.parametrize("arch", [80, 86, 89])
def test_shared_memory_fits_the_card(compiled, arch):
    limit = SHARED_MEMORY_LIMIT_BYTES[arch]
    over = {name: r["shared_bytes"] for name, r in compiled.items() if r["shared_bytes"] > limit}
    assert over == {}, f"above sm_{arch}'s {limit} B a program"
    assert all(r["shared_bytes"] >= 0 for r in compiled.values())


def test_no_local_memory_and_registers_in_range(compiled):
    assert [name for name, r in compiled.items() if r["local_memory"]] == []
    assert all(0 < r["registers"] <= 255 for r in compiled.values())
