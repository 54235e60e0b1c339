#!/usr/bin/env bash
# Session 46, sixth call (the last ~220 s of device time): the same-card half that call 5 lacks.  Call 3 (H100) timed
# the recorded 1.5B backbone at 4096 tokens with DENSE_ROWS_MIN_EXPECTED = 16 (row kernel 11.2 ms over 28 layers,
# sparse 34.14 ms GPU against dense 26.51); call 5 (H200) with 1 (row kernel 3.64 ms, 27.92 against 25.90).  On an
# H200 this runs 16, on an H100 1, so that each card holds both.  Predicted: H200 with 16, row kernel ~10-11 ms and
# the sparse forward ~33-34 ms; H100 with 1, row kernel ~3.5-4 ms and ~28-29 ms.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session46_call6.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session46 6
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
rows=1
case "$card" in *H200*) rows=16 ;; esac
echo "$card: DENSE_ROWS_MIN_EXPECTED=$rows"
stage "recorded_forward_probe_rows${rows}_4096_bound3" "$(left 200)" \
  "^tokens=.*(gpu|dense rows)|^ {4} *[0-9].*(twell|hot_cold_gate|NNT)|Error" \
  python3 scripts/recorded_forward_probe.py --policy tables --tokens 4096 --top 10 --samples 5 --min-expected "$rows" \
  --out "$R/rows${rows}_4096_bound3"
call_end
