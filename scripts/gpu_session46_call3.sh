#!/usr/bin/env bash
# Session 46, third call (H100 machine): the recorded 1.5B backbone at 4096 tokens ran its sparse FFN kernels in
# ~0.49 ms a layer against compiled dense's ~0.40 (recorded_forward_probe_call3_session46.log: _twell_ffn_row_kernel
# 7.49 ms + _hot_cold_gate_kernel 4.60 + hot down GEMM 0.82 + row listing 0.68 over 28 layers), yet session 45's eager
# decoder layers took 21.48 ms of GPU time sparse against 22.41 dense there.  Same probe with the tables policy (eager
# calls sparse too) and the eager forward's kernels beside the recorded ones, 4096 and 8192 tokens in separate
# processes (each chooses its own hot sets).  Predicted: the eager sparse kernels as long as the recorded ones (same
# hot sets, same ops), eager dense ~2-3 ms longer than recorded dense (relu and mul unfused, norms), so eager
# sparse ~= eager dense at 4096; at 8192 the eager hot sets (bound 10) smaller than at 4096 and sparse ahead ~1.1-1.2x.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session46_call3.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session46 3
for n in 4096 8192; do
  stage "recorded_forward_probe_tables_$n" "$(left 520)" "^tokens=|^ {4} *[0-9]|skip|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --tokens "$n" --top 8 --out "$R/tables_$n"
done
call_end
