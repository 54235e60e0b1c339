#!/usr/bin/env bash
# Session 46, fifth call (H100 machine): the row kernel's tail.  At 4096 tokens the model's row kernel took 11.2 ms
# over 28 layers with bound 3's hot sets and 27.4 ms with bound 10's (call 4), against 8.8 ms at 8192 tokens with the
# same sets as bound 10's: below the dense-row pass's DENSE_ROWS_MIN_EXPECTED = 16 expected overflowing rows, a few
# rows that overflow several cold tiles each run serially in one program.  Call 1's per-layer spans at 8192 tokens
# agree (layer 3: 48 overflowing tiles in 9 tokens, no dense-row budget, 1.143 ms against ~0.6 for layers without).
# Same probe with DENSE_ROWS_MIN_EXPECTED = 1.  Predicted: at 8192 tokens the 28 FFNs ~2 ms shorter (eager GPU 39.30
# -> ~37.3 ms, recorded 48.64 -> ~46.6, 1.09x of dense); at 4096 tokens the row kernel under ~6 ms with either bound,
# the recorded sparse forward ~26-29 ms (dense 26.5).
#   TWELL_COMMIT=<sha> bash scripts/gpu_session46_call5.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session46 5
for run in "4096 3" "4096 10" "8192 3"; do
  set -- $run
  stage "recorded_forward_probe_rows1_$1_bound$2" "$(left 420)" \
    "^tokens=.*(gpu|dense rows)|^ {4} *[0-9].*(twell|hot_cold_gate|NNT)|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --tokens "$1" --top 10 --small-bound "$2" \
    --min-expected 1 --out "$R/rows1_$1_bound$2"
done
call_end
