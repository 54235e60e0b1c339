"""The session 46 figures that the README, docs/performance.md and the dense-row rule's comment quote are the committed
runs' (``bench_results/h100/session46_runs.md``): the recorded 1.5B backbone, the graphed decode, and the row kernel's
device time over the 28 layers at 4096 tokens with and without a dense-row pass on every layer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import kernel_ms, probe_rows

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"
H200 = ROOT / "bench_results" / "h200"
README = (ROOT / "README.md").read_text()
CACHE_SOURCE = (ROOT / "src" / "twell" / "nn" / "hot_cold_cache.py").read_text()


def _forward(name: str) -> dict:
    return json.loads((H100 / name).read_text())["meta"]["parts"]["forward"]["result"]["variants"]


@pytest.mark.parametrize(("batch", "speedup", "sparse_ms", "dense_ms"),
                         [(2, "0.787x", "35.45", "27.90"), (4, "1.057x", "50.11", "52.98")])
def test_recorded_backbone_figures(batch, speedup, sparse_ms, dense_ms):
    v = _forward(f"model_forward_recorded_b{batch}_session46.json")
    assert f"{v['sparse:default']['compiled_speedup']:.3f}x" == speedup
    assert f"{v['sparse:default']['compiled_ms']:.2f}" == sparse_ms
    assert f"{v['dense']['compiled_ms']:.2f}" == dense_ms
    assert speedup in README
    if batch == 2:
        assert f"{speedup} of recorded dense ({sparse_ms} vs {dense_ms} ms)" in README


def test_graphed_decode_figures():
    batches = json.loads((H100 / "model_decode_session46.json").read_text())["meta"]["parts"]["decode"]["result"][
        "batches"]
    got = [f"{batches[b]['sparse:default']['speedup']:.3f}x" for b in ("2", "8")]
    assert got == ["1.156x", "1.116x"]
    assert "1.156x / 1.116x in session 46" in README


def test_row_kernel_with_and_without_a_pass_on_every_layer():
    without = probe_rows(H100 / "recorded_forward_probe_tables_4096_session46.json")["sparse:tables"]
    assert f"{kernel_ms(without, '_twell_ffn_row_kernel'):.2f}" == "11.21"
    with_pass = probe_rows(H200 / "recorded_forward_probe_rows1_4096_bound3_session46.json")
    sparse, dense = with_pass["sparse:tables"], with_pass["dense"]
    assert f"{kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f}" == "3.64"
    assert all(n == 64 for n in sparse["dense_rows"])  # DENSE_ROWS_MIN_EXPECTED = 1: a pass on every layer
    assert f"{dense['gpu_ms'] / sparse['gpu_ms']:.2f}x" == "0.93x"
    assert f"{dense['wall_ms'] / sparse['wall_ms']:.2f}x" == "0.96x"
    assert "11.2 ms of row kernel" in README and "11.2 ms of row kernel" in CACHE_SOURCE
    assert "against 3.64 ms" in CACHE_SOURCE


def test_per_layer_spans_the_rule_cites():
    log = (H100 / "forward_layer_times_b4_callrecorded_session46.log").read_text()
    pattern = re.compile(r"^layer +(\d+): .*sparse +([\d.]+) ms.*overflowing cold tiles +(\d+) in +(\d+) tokens, "
                         r"dense-row budget +(\d+)$", re.M)
    spans = {int(m[1]): (m[2], int(m[3]), int(m[4]), int(m[5])) for m in pattern.finditer(log)}
    assert len(spans) == 28
    for layer, want in [(3, ("1.143", 48, 9, 0)), (4, ("1.000", 37, 11, 0)), (18, ("0.643", 2, 1, 0)),
                        (19, ("0.546", 0, 0, 0)), (22, ("0.640", 2, 1, 0)), (23, ("0.521", 0, 0, 0))]:
        assert spans[layer] == want, (layer, spans[layer])
        assert want[0] in CACHE_SOURCE
    assert [spans[i][3] for i in range(3)] == [128, 128, 128]  # layers 0-2 ran the pass
