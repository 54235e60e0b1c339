#!/usr/bin/env bash
# Session 25, GPU call 3 (hot_cold.LIST_BESIDE_GATE on; cold-down path given contiguous counts): the GPU tests of the
# op and its kernels, scripts/tail_probe.py with the "beside" variant, and the FFN headline in one run.  OUT,
# TWELL_COMMIT from the caller; files packed into $OUT/results_call3_session25.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src:scripts PYTHONUNBUFFERED=1
S=session25
R="$OUT/run"
mkdir -p "$R"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_hot_cold_tail.py tests/test_ops_hot_cold_gate.py \
  tests/test_ops_twell_list.py tests/test_ops_gather_heavy_first.py tests/test_ops_hot_cold.py tests/test_ops_residual.py \
  tests/test_ops_hot_cold_dense_rows.py tests/test_ops_cold_down.py tests/test_ops_gpu.py > "$R/pytest_gpu_beside_$S.log" 2>&1
echo "pytest rc=$?"; grep -E "FAILED|passed|failed" "$R/pytest_gpu_beside_$S.log" | tail -6
timeout 200 python3 scripts/tail_probe.py > "$R/tail_probe_beside_$S.log" 2>&1
echo "tail probe rc=$?"; grep -v "^ " "$R/tail_probe_beside_$S.log" | grep -v "back to back" | cut -c1-420
grep "back to back" "$R/tail_probe_beside_$S.log" | cut -c1-200
timeout 170 python3 -m twell.cli bench ffn --shape 2048x5632 --ms 16384 131072 --densities 0.5 1 --extra \
  --energy-seconds 1 --out "$R" --stem ffn_headline_beside_$S > "$R/ffn_headline_beside_$S.log" 2>&1
echo "headline rc=$?"; grep "^| 2048" "$R/ffn_headline_beside_$S.log"
tar czf "$OUT/results_call3_$S.tgz" -C "$OUT" run && rm -rf "$R"
