#!/usr/bin/env bash
# Run in session 53 (bench_results/h100/session53_runs.md, call 1: hypothesis (a), budget 0; fixed by
# hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS).  Written in session 52: where a 2048-token call of the synthetic 2048x5632
# layer with a steep sequence head goes.  Session 52's call 3 (PART=3 of gpu_pending_heavy_rows.sh, H100: tune-dispatch
# --early-boost 40 --early-decay 4, the module held sparse; bench_results/h100/session52_runs.md) ran it at 0.70x of
# dense at 0.5 % (0.322 ms against 0.161 with the default head), 0.83x at 0.25 %, 1.00x at 1 %, with the long-row
# bound at 64 or 0 alike, while 4096 tokens (two sequences, two heads) took 0.350 ms.  tune-dispatch's 2048-token call
# is the first whole sequence, so its heavy rows are positions 0-15 of one head.
# Hypotheses, each with what the profile shows:
#   (a) the dense-row budget is 0 on the GPU's data (the refresh sample predicting fewer than 16 overflowing rows and
#       no row with two overflowing tiles), so position 0 (~560 cold pairs, many overflowing tiles) stays in the row
#       kernel: a ~0.15 ms tail of one program.  Shows as "dense-row budget 0" and _twell_ffn_row_kernel ~0.2 ms.
#   (b) a budget is set and the pass itself costs ~0.15 ms at this size.  Shows as the pass's GEMMs and kernels.
# On the CPU (bench_results/cpu_counts/session52_steep_head_budget.log: a CPU generator, bf16) position 0 has 19
# overflowing tiles and the budget is 64, which argues for (b) or for something neither names.
# Then, per call, the module's and the op's kernels (scripts/infer_op_profile.py), the refresh's budget and counts.
#   TWELL_COMMIT=<sha> bash scripts/gpu_pending_steep_head.sh     (~150-250 s)
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session53}" steephead
nvidia-smi --query-gpu=name --format=csv,noheader
stage profile_head40 "$(left 170)" "^M=|^ +[0-9]" python3 scripts/infer_op_profile.py --policy sparse \
  --early-boost 40 --early-decay 4 --points 2048:28 2048:56 4096:28
stage profile_head4 "$(left 250)" "^M=|^ +[0-9]" python3 scripts/infer_op_profile.py --policy sparse --points 2048:28
call_end
