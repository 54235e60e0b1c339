#!/usr/bin/env bash
# Ran in session 47 (0c1dedd, H100; bench_results/h100/session47_runs.md): batch 4 1.136x; batch 2 was cut by its
# 110 s limit on a fresh machine (rerun alone: 0.980x; the limits are now 200 / 330 s) and the suite by the call's end
# after 153 passed (the whole suite: scripts/gpu_pending_suite.sh).
# Session 47, after the dense-row A/B (scripts/gpu_pending_dense_rows_ab.sh; bench_results/h100/session47_runs.md):
# `twell bench model --forward-compile-mode reduce-overhead` now records inside static_dispatch(cached_weights=True)
# by default.  First the README recipe's two figures with that default: the 1.5B backbone recorded at 4096 tokens
# (batch 2) and 8192 (batch 4).  Predicted from this session's H100 runs: batch 2 ~1.00-1.03x of recorded dense (the
# first run with the copies: 1.016x, 28.05 vs 28.49 ms; without them 0.950x), batch 4 ~1.10-1.14x (the probe's 8192
# tokens with the copies: 1.114x by GPU time, 1.124x wall; session 46's bench without the rule or the copies 1.057x).
# Then the whole GPU suite with what is left (session 45 on an H100: 193 passed in 337.94 s; since then the dense-row
# rule and cached_weights, whose recorded GPU test passed in this session's first call).
#   TWELL_SESSION=session47 TWELL_COMMIT=<sha> bash scripts/gpu_pending_cached_recipe.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session47}" cached
nvidia-smi --query-gpu=name --format=csv,noheader
for b in 2 4; do
  stage "model_forward_recorded_cached_b$b" "$(left $((b == 2 ? 200 : 330)))" "^\| forward|^total|Error" \
    python3 -m twell.cli bench model --preset 1.5b --parts forward --batch "$b" --fused-norms --fused-residual \
    --forward-policies default --forward-compile --forward-compile-mode reduce-overhead --out "$R" \
    --stem "model_forward_recorded_cached_b${b}_${S}"
  forward_summary "$R/model_forward_recorded_cached_b${b}_${S}.json"
done
stage pytest_gpu_all "$(left 590)" "passed|failed|FAILED|Error" python3 -m pytest tests -q -m gpu -p no:cacheprovider
call_end
