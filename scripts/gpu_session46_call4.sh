#!/usr/bin/env bash
# Session 46, fourth call (H100 machine): at 4096 tokens the 1.5B model's sparse FFNs lost eager as well as recorded
# (call 3: eager GPU 28.84 ms sparse vs 23.46 dense; recorded 34.14 vs 26.51), their hot sets 768-2432 units of 5632
# under the small-call bound (HOT_MAX_COLD_L0_SMALL = 3 cold pairs a token, tuned on the synthetic generator), the row
# kernel 11.2 ms over 28 layers against 8.8 ms at 8192 tokens with bound 10's 128-832 hot units.  Same probe with
# bound 10 and 6 below 8192 tokens.  Predicted with 10: hot sets ~128-832, row kernel ~4.5-5 ms, gate ~4.2 ms, the
# sparse forward's GPU ms ~22-23 eager (~1.02-1.07x of dense) and ~25-26 recorded (~1.02-1.05x); 6 in between.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session46_call4.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session46 4
for b in 10 6; do
  stage "recorded_forward_probe_bound$b" "$(left 400)" "^tokens=.*(gpu|l0)|^ {4} *[0-9].*(twell|hot_cold|NNT)|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --tokens 4096 --top 8 --small-bound "$b" \
    --out "$R/bound$b"
done
call_end
