#!/usr/bin/env bash
# Session 26, GPU call 2 (each row-block count released a mainloop late, the poll an acquire load, the max shared carveout; the list programs launched
# from the gate's last rounds): the hot/cold tail's GPU tests, then scripts/tail_probe.py (the beside variants against
# the shipped launches). OUT from the caller; files packed into $OUT/results_call2_session26.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src:scripts PYTHONUNBUFFERED=1
S=session26
R="$OUT/run"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$R/environment_$S.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> "$R/environment_$S.txt"
T0=$SECONDS
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_hot_cold_tail.py > "$R/pytest_gpu_tail_call2_$S.log" 2>&1
echo "pytest rc=$?"; grep -E "FAILED|passed|failed|Error" "$R/pytest_gpu_tail_call2_$S.log" | tail -8
LEFT=$(( 570 - (SECONDS - T0) ))
timeout "$LEFT" python3 scripts/tail_probe.py > "$R/tail_probe_call2_$S.log" 2>&1
echo "tail probe rc=$?"; grep "interleaved\|bit for bit\|_hot_cold_gate_kernel\|_list_twell\|back to back" "$R/tail_probe_call2_$S.log" | cut -c1-400
tar czf "$OUT/results_call2_$S.tgz" -C "$OUT" run && rm -rf "$R"
