#!/usr/bin/env bash
# Pending since session 47 (no device time left for it): the dense-row pass's Triton kernels
# (twell.ops.dense_rows_kernels, hot_cold_dense_rows.FUSED_PASS, shipped off until this runs: the selection in two
# launches, the gated product and the write-back with the residual in one each; 8 launches a pass instead of ~20, the
# same bits).  First their GPU tests (bit-equality with the PyTorch twins at 4096 / 131,072 tokens and at d=2048,
# F=5632), then the recorded 1.5B forward (the README's recipe: cached weights, tables policy) with the kernels
# (--fused-pass) and without (--no-fused-pass), each in its own process, at 4096 and 8192 tokens.
# Predicted (H100, session 47's runs: the pass on 23 of 28 layers at 4096 tokens, 16 at 8192, ~0.07-0.08 ms a pass of
# which ~0.025 ms is its GEMMs' weight reads): ~12 fewer small kernels a pass, ~0.02-0.035 ms each pass, so the
# recorded sparse forward ~0.5-0.8 ms faster at 4096 tokens (26.94 ms in session 47: ~1.00-1.02x of dense against
# 0.988x) and ~0.3-0.6 ms at 8192 (46.10 ms: ~1.12x against 1.114x).  If the kernels win and their tests pass, set
# FUSED_PASS = True.
# Then the whole GPU suite with what is left (or scripts/gpu_pending_suite.sh in a call of its own).
#   TWELL_SESSION=session48 TWELL_COMMIT=<sha> bash scripts/gpu_pending_fused_pass.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session48}" fusedpass
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_gpu_dense_rows "$(left 120)" "passed|failed|error" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_ops_dense_rows_kernels.py tests/test_ops_hot_cold_dense_rows.py tests/test_ops_residual.py
# each probe ~45-75 s (session 47), the first more on a fresh machine; the suite gets what is left
budget=200
for n in 4096 8192; do
  for variant in fused unfused; do
    flag=(--fused-pass)
    [ "$variant" = unfused ] && flag=(--no-fused-pass)
    stage "probe_${variant}_$n" "$(left "$budget")" \
      "^tokens=.*(gpu)|^ {4} *[0-9].*(twell|hot_cold_gate|overflow|gated_product|scatter_rows)|Error" \
      python3 scripts/recorded_forward_probe.py --policy tables --tokens "$n" --top 40 --samples 5 --cached-weights \
      "${flag[@]}" --out "$R/${variant}_$n"
    budget=$((budget + 85))
  done
done
# then the small-call hot-set bound again now that the several-tiles rule handles the overflowing rows: session 46 on
# the H200 with a pass on every layer had bound 10 at 26.94 ms against bound 3's 27.92 (row kernel 4.74 vs 3.64, gate
# 4.16 vs 4.87; bench_results/h200/recorded_forward_probe_rows1_4096_bound{10,3}_session46.json), while the synthetic
# tuning chose 3 (hot_cold_plan.HOT_MAX_COLD_L0_SMALL's comment).  Predicted ~0.5-1 ms faster than fused_4096 here;
# a change would also need the synthetic 2048 / 4096-token points retimed.
stage probe_fused_bound10_4096 "$(left "$budget")" \
  "^tokens=.*(gpu)|^ {4} *[0-9].*(twell|hot_cold_gate)|Error" \
  python3 scripts/recorded_forward_probe.py --policy tables --tokens 4096 --top 40 --samples 5 --cached-weights \
  --small-bound 10 --fused-pass --out "$R/fused_bound10_4096"
stage pytest_gpu_all "$(left 590)" "passed|failed|FAILED|Error" python3 -m pytest tests -q -m gpu -p no:cacheprovider
call_end
