#!/usr/bin/env bash
# Session 25, GPU call 1: the GPU tests of the op's tail (one counts buffer, the gate zeroing the heavy counter,
# the list pass and gather as programmatic dependents) and of the kernels it touches, then scripts/tail_probe.py
# (session 24's launches against session 25's, with hot_cold.LIST_PDL off and on).  OUT, TWELL_COMMIT from the
# caller; files packed into $OUT/results_call1_session25.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src:scripts PYTHONUNBUFFERED=1
S=session25
R="$OUT/run"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/environment_$S.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> "$R/environment_$S.txt" 2>&1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_hot_cold_tail.py tests/test_ops_hot_cold_gate.py \
  tests/test_ops_twell_list.py tests/test_ops_gather_heavy_first.py tests/test_ops_hot_cold.py tests/test_ops_residual.py \
  tests/test_ops_hot_cold_dense_rows.py tests/test_ops_gpu.py > "$R/pytest_gpu_tail_$S.log" 2>&1
echo "pytest rc=$?"; tail -5 "$R/pytest_gpu_tail_$S.log"
timeout 300 python3 scripts/tail_probe.py > "$R/tail_probe_$S.log" 2>&1
echo "tail probe rc=$?"; grep -v "^ " "$R/tail_probe_$S.log" | cut -c1-400
tar czf "$OUT/results_call1_$S.tgz" -C "$OUT" run && rm -rf "$R"
