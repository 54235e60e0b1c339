#!/usr/bin/env bash
# Session 45, after call 2 (bench_results/h100/session45_runs.md): the 1.5B backbone compiled at 8192 tokens read
# 0.998x of compiled dense with the default policy (its eager calls below the eager floor ran dense and chose no hot
# set, so the traced calls ran dense too) and 1.070x with the tables alone.  `twell bench model --forward-compile` now
# makes the README's warm-up call for compiled layers (one eager forward inside static_dispatch per sparse set).
# Predicted: the default's compiled forward at 8192 tokens ~1.05-1.08x (as the tables'), its eager forward ~1.0x
# (dense below the floor); at 4096 tokens (batch 2) compiled ~0.98-1.04x (the layers' GPU time there: 21.48 sparse vs
# 22.41 ms dense, model_host_time_callhost_session45b.log).
#   TWELL_SESSION=session45 TWELL_COMMIT=<sha> bash scripts/gpu_session45_call3.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session45}" 3
nvidia-smi --query-gpu=name --format=csv,noheader
for b in 4 2; do
  pol=default,tables; [ "$b" = 2 ] && pol=default
  stage "model_forward_b$b" "$(left $((b == 4 ? 300 : 560)))" "^\| forward|^total|Error" python3 -m twell.cli bench \
    model --preset 1.5b --parts forward --batch "$b" --fused-norms --fused-residual --forward-policies "$pol" \
    --forward-compile --out "$R" --stem "model_forward_b${b}_${S}"
  forward_summary "$R/model_forward_b${b}_${S}.json"
done
call_end
