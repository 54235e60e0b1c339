"""Helpers shared by several test files (imported as ``_helpers``: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

F64 = torch.float64
#: Integer views for bit-pattern comparisons, by float dtype.
INT_VIEW = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def assert_bitwise_equal(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Same dtype, shape and bit pattern (NaN payloads included)."""
    assert out.dtype == ref.dtype
    assert out.shape == ref.shape
    assert torch.equal(out.contiguous().view(INT_VIEW[out.dtype]), ref.contiguous().view(INT_VIEW[ref.dtype]))


def make_inputs(
    m: int,
    d: int,
    f: int,
    density: float,
    seed: int,
    dtype: torch.dtype = F64,
    empty_rows: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random (x, w_gate, w_up, w_down) whose gates are positive for about ``density`` of the pairs.

    Column 0 of x is a constant 1, so column 0 of w_gate acts as a bias; it is set to minus a threshold
    placed half-way between two consecutive sorted gate values, so the density is hit exactly (in
    float64) and no gate is exactly 0.  Rows in ``empty_rows`` get x = e_0, so their gates all equal
    the (negative, for density < ~50 %) bias: the row has no active unit.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=gen, dtype=F64)
    x[:, 0] = 1.0
    for r in empty_rows:
        x[r, 1:] = 0.0
    w_gate = torch.randn(f, d, generator=gen, dtype=F64) / math.sqrt(d)
    w_up = torch.randn(f, d, generator=gen, dtype=F64) / math.sqrt(d)
    w_down = torch.randn(d, f, generator=gen, dtype=F64) / math.sqrt(f)
    w_gate[:, 0] = 0.0
    pre = (x @ w_gate.T).flatten().sort().values
    n = pre.numel()
    k = round((1.0 - density) * n)
    if n == 0:
        thr = 0.0
    elif k <= 0:
        thr = float(pre[0]) - 1.0
    elif k >= n:
        thr = float(pre[-1]) + 1.0
    else:
        thr = 0.5 * float(pre[k - 1] + pre[k])
    w_gate[:, 0] = -thr
    return tuple(t.to(dtype) for t in (x, w_gate, w_up, w_down))  # type: ignore[return-value]


#: The tiny Llama/Qwen2 shape of the CPU model tests (hidden 64, 2 layers, 4 heads, vocab 128) and the
#: twell options that keep its sparse layers on the torch backend with tile 32.
TINY_ARCH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
TINY_TWELL = {"twell_backend": "torch", "twell_tile": 32}


def row_kernel_args(p: dict, tile: int, capacity: int) -> tuple:
    """The row-gather kernel's positional arguments (``launch_twell_ffn``) for problem ``p``: its TwELL gate at
    ``tile`` / ``capacity`` (no spill area), Wg, Wu and Wd^T contiguous."""
    import twell.ops as ops

    gate = ops.gate_twell(p["x"], p["w_gate"], tile=tile, capacity=capacity)
    return (p["x"], gate.values, gate.indices, gate.counts, None, None, p["w_gate"], p["w_up"],
            p["w_down"].t().contiguous())


def check_gradient_checkpointing(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """A twell causal LM in training mode: non-reentrant checkpointing (the default) gives the loss and gradients of
    the plain step, L1 term included; reentrant runs the MLPs without grad, which the L1 check refuses."""
    import pytest

    ref = model(input_ids=ids, labels=ids)
    ref.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    torch.testing.assert_close(out.loss, ref.loss)
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(RuntimeError, match="use_reentrant"):
        model(input_ids=ids, labels=ids, use_cache=False)


def count_sparse_calls(monkeypatch) -> list[int]:  # noqa: ANN001
    """The token counts of every ``SparseGatedMLP`` call that takes its sparse path from now on (a spy on
    ``_ffn_sparse``, removed by ``monkeypatch`` after the test)."""
    from twell.nn import SparseGatedMLP

    calls: list[int] = []
    real = SparseGatedMLP._ffn_sparse

    def spy(self, x, residual=None):  # noqa: ANN001, ANN202
        calls.append(x.shape[0])
        return real(self, x, residual)

    monkeypatch.setattr(SparseGatedMLP, "_ffn_sparse", spy)
    return calls



def recording_backend(graphs: list[str]):  # noqa: ANN201 - dynamo's backend callable
    """A ``torch.compile`` backend that appends each traced graph's Python code to ``graphs`` and runs the graph as
    traced (what a test reads to see which ops a compiled call took)."""

    def backend(gm, example_inputs):  # noqa: ANN001, ANN202 - dynamo's backend signature
        graphs.append(gm.code)
        return gm.forward

    return backend


def set_dense_row_pass(monkeypatch, fused: bool, batch_rows: int) -> None:  # noqa: ANN001
    """The dense-row pass for the rest of a test: its PyTorch twins (``fused`` False) or its Triton kernels, passes of
    up to ``batch_rows`` rows through the small-batch kernels (0: the three GEMMs; ``hot_cold_dense_rows.FUSED_PASS``,
    ``BATCH_PASS_MAX_ROWS``)."""
    from twell.ops import hot_cold_dense_rows

    monkeypatch.setattr(hot_cold_dense_rows, "FUSED_PASS", fused)
    monkeypatch.setattr(hot_cold_dense_rows, "BATCH_PASS_MAX_ROWS", batch_rows)


def probe_rows(path: Path) -> dict[str, dict]:
    """A ``scripts/recorded_forward_probe.py`` JSON's rows by variant set (``dense``, ``sparse:<policy>``)."""
    return {r["set"]: r for r in json.loads(Path(path).read_text())["rows"]}


def kernel_ms(row: dict, name: str) -> float:
    """Device ms of a probe row's top kernels whose names start with ``name``."""
    return sum(k["device_us"] for k in row["top_kernels"] if k["name"].startswith(name)) / 1e3


#: The dense-row pass's four kernels (twell.ops.dense_rows_kernels) as a probe row's top kernels name them.
DENSE_ROW_PASS_KERNELS = ("_overflow_flags_kernel", "_overflow_ranks_kernel", "_gated_product_kernel",
                          "_scatter_rows_kernel")


def pass_kernels_us(row: dict) -> float:
    """Device microseconds of a probe row's dense-row pass kernels, summed over the call."""
    return sum(kernel_ms(row, name) for name in DENSE_ROW_PASS_KERNELS) * 1e3


#: cuBLAS kernels every variant of the recorded forward launches (the attention's projections and the hot units' down
#: projection); the other ``nvjet`` kernels of a sparse row are the dense-row pass's GEMMs.
SHARED_GEMMS = ("nvjet_sm90_tst_256x128_64x4_1x2_h_", "nvjet_sm90_tss_256x128_64x4_1x2_h_")


def pass_gemms_ms(row: dict) -> float:
    """Device ms of a probe row's dense-row pass GEMMs: its ``nvjet`` kernels but :data:`SHARED_GEMMS`."""
    return sum(k["device_us"] for k in row["top_kernels"]
               if k["name"].startswith("nvjet") and not k["name"].startswith(SHARED_GEMMS)) / 1e3


def long_row_probe_figures(path: Path, heavy: int, counted: bool) -> tuple[dict, tuple[str, ...]]:
    """A long-row A/B's recorded-forward probe (sessions 49-50): checks the run's switches and recipe (the bound, the
    counted budgets, the fused pass, cached weights, the tables policy, one CUDA graph), and returns its sparse row
    with its figures as the session logs print them: passes, row kernel ms, pass kernels us, sparse and dense GPU ms,
    the ratio."""
    meta, rows = json.loads(Path(path).read_text()), probe_rows(path)
    assert meta["heavy_pairs"] == heavy and meta["count_heavy"] is counted
    assert meta["fused_pass"] is True and meta["cached_weights"] is True and meta["policy"] == "tables"
    sparse, dense = rows["sparse:tables"], rows["dense"]
    assert sparse["cudagraph_skips"] == 0 and sparse["unique_graphs"] == 1 and all(sparse["cached_weights_ready"])
    return sparse, (str(sum(1 for n in sparse["dense_rows"] if n)), f"{kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f}",
                    f"{pass_kernels_us(sparse):.1f}", f"{sparse['gpu_ms']:.2f}", f"{dense['gpu_ms']:.2f}",
                    f"{dense['gpu_ms'] / sparse['gpu_ms']:.3f}x")


def flat_text(path: Path) -> str:
    """A file's text with line breaks, comment markers and runs of spaces as single spaces (the provenance tests'
    quotes span wrapped lines)."""
    return " ".join(Path(path).read_text().replace("#:", " ").split())


def hot_cold_test_layer(policy, **kw):  # noqa: ANN001, ANN201 - twell.nn types imported here only
    """A 32 x 256 fp32 ``SparseGatedMLP`` (Triton backend, tile 32) under ``policy`` whose inputs from
    :func:`hot_cold_test_tokens` fire 64 frequent units and rare others: the hot/cold split's test layer."""
    from twell.nn import SparseGatedMLP

    d, f = 32, 256
    gen = torch.Generator().manual_seed(0)
    wg = torch.randn(f, d, generator=gen) / d**0.5
    wg[:, 0] = -2.5  # x[:, 0] = 1: a bias channel, rare units ...
    wg[:64, 0] = 1.0  # ... but 64 frequent ones
    wu = torch.randn(f, d, generator=gen) / d**0.5
    wd = torch.randn(d, f, generator=gen) / f**0.5
    return SparseGatedMLP.from_weights(wg, wu, wd, backend="triton", tile=32, policy=policy, **kw).eval()


def hot_cold_test_tokens(m: int, seed: int) -> torch.Tensor:
    """``m`` tokens for :func:`hot_cold_test_layer` (channel 0 held at 1)."""
    x = torch.randn(m, 32, generator=torch.Generator().manual_seed(seed))
    x[:, 0] = 1.0
    return x


def clean_gpu_suite_passed(log: Path) -> int:
    """How many tests a ``-m gpu`` pytest log (one of ``scripts/gpu_kernel_tests.sh``'s processes) says passed; fails
    the test where the log names a failure or a skip, or has no summary line."""
    text = Path(log).read_text()
    m = re.search(r"(\d+) passed, \d+ deselected", text)
    assert m and "failed" not in text and " skipped" not in text, f"{log}: not a clean run"
    return int(m.group(1))
