#!/usr/bin/env bash
# Pending since session 46 (bench_results/h100/session46_runs.md): the same-card A/B of the dense-row pass's
# several-tiles rule (DENSE_ROWS_SEVERE_TILES = 2, DENSE_ROWS_MIN_SEVERE = 1, twell.nn.hot_cold_cache), shipped on
# session 46's per-layer spans (H100, 8192 tokens: rows with 2+ overflowing cold tiles and no budget cost 0.1-0.5 ms a
# layer against a ~0.07-0.08 ms pass) and a cross-card comparison (the recorded 1.5B forward at 4096 tokens, row
# kernel 11.21 ms over 28 layers on an H100 with the 16-row rule alone, 3.64 on an H200 with a budget everywhere).
# One process per variant, the tables policy (eager calls sparse too), all on this call's card:
#   severe 0 (the rule off: session 45's behaviour) / shipped / DENSE_ROWS_MIN_EXPECTED = 1, at 4096 and 8192 tokens.
# Predicted: shipped against off, the row kernel at 4096 tokens ~3.5-5 ms against ~11 (H100), the recorded sparse
# forward ~0.93-0.97x of dense against ~0.78x; at 8192 tokens ~1.08-1.12x against ~1.04x; min-expected 1 within 2 % of
# shipped.  Then the synthetic op where session 29 set the 16-row rule (16,384 tokens at 2 %: the pass cost 0.079 ms
# for ~4 expected single-tile rows): `twell bench ffn` at 4096 / 16384 tokens, 0.5 / 2 %, shipped vs rule off;
# predicted within the run's spread (synthetic rows rarely overflow two tiles).
#   TWELL_SESSION=session47 TWELL_COMMIT=<sha> bash scripts/gpu_pending_dense_rows_ab.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session47}" rowsab
nvidia-smi --query-gpu=name --format=csv,noheader
for n in 4096 8192; do
  for variant in "severe0:--severe-tiles 0" "shipped:" "rows1:--min-expected 1"; do
    name=${variant%%:*} args=${variant#*:}
    # shellcheck disable=SC2086  # args: zero or two words
    stage "probe_${name}_$n" "$(left 480)" "^tokens=.*(gpu|dense rows)|^ {4} *[0-9].*(twell|hot_cold_gate|NNT)|Error" \
      python3 scripts/recorded_forward_probe.py --policy tables --tokens "$n" --top 40 --samples 5 $args \
      --out "$R/${name}_$n"
  done
done
for variant in "severe0:twell.nn.hot_cold_cache.DENSE_ROWS_SEVERE_TILES=0" "shipped:twell.nn.hot_cold_cache.DENSE_ROWS_SEVERE_TILES=2"; do
  name=${variant%%:*}
  stage "ffn_${name}" "$(left 580)" "^\| 2048x5632|Error" python3 scripts/twell_patched.py --set "${variant#*:}" -- \
    bench ffn --ms 4096 16384 --densities 0.5 2 --shape 2048x5632 --extra --out "$R" --stem "ffn_rows_${name}_$S"
done
call_end
