#!/usr/bin/env bash
# Ran in session 47 (two calls on one H100, 297fbc3; bench_results/h100/session47_runs.md): the rule kept.
# Pending since session 46 (bench_results/h100/session46_runs.md; more than one 10-minute call: a later call runs
# what the first skipped through TWELL_ONLY): the same-card A/B of the dense-row pass's several-tiles rule
# (DENSE_ROWS_SEVERE_TILES = 2, DENSE_ROWS_MIN_SEVERE = 1, twell.nn.hot_cold_cache), shipped on session 46's
# per-layer spans (H100, 8192 tokens: rows with 2+ overflowing cold tiles and no budget cost 0.1-0.5 ms a layer
# against a ~0.07-0.08 ms pass) and a cross-card comparison (the recorded 1.5B forward at 4096 tokens, row kernel
# 11.21 ms over 28 layers on an H100 with the 16-row rule alone, 3.64 on an H200 with a budget everywhere).
# One process per variant, the tables policy (eager calls sparse too), all on this call's card, in this order:
# severe 0 (the rule off: session 45's behaviour) and shipped at 4096 and 8192 tokens, the bench's recorded forward,
# DENSE_ROWS_MIN_EXPECTED = 1 at 4096, the cached weight copies at 4096 and 8192 (and the bench's forward with them),
# then 12,288 tokens off / shipped.
# Predicted: shipped against off, the row kernel at 4096 tokens ~3.5-5 ms against ~11 (H100), the recorded sparse
# forward ~0.93-0.97x of dense against ~0.78x; at 8192 tokens ~1.08-1.12x against ~1.04x; min-expected 1 within 2 % of
# shipped.  The synthetic FFN problem (twell bench ffn, tune-dispatch) has no overflowing row in its refresh sample at
# 0.25-10 % (bench_results/cpu_counts/session46_severe_rows.log), so the rule leaves those sweeps as they were.  Then
# the bench's own recorded forward at 4096 tokens with the shipped rule (session 46: 0.787x before it), predicted
# ~0.93-0.97x.  Last, 12,288 tokens (eager calls sparse there under the default policy too): the eager wall clock with
# the rule against without, predicted within 2 % (the pass's ~18 launches a layer are host time near the floor).
#   TWELL_SESSION=session47 TWELL_COMMIT=<sha> bash scripts/gpu_pending_dense_rows_ab.sh
#   TWELL_ONLY="cached_4096 cached_8192 shipped_12288" ...   # a later call: only the runs these labels name
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session47}" rowsab
nvidia-smi --query-gpu=name --format=csv,noheader
wanted() {  # label: whether TWELL_ONLY (space-separated labels) is unset or names it
  [ -z "${TWELL_ONLY:-}" ] || [[ " $TWELL_ONLY " == *" $1 "* ]]
}
probe() {  # name, tokens, probe arguments...: one probe process, labelled name_tokens
  local name=$1 n=$2
  shift 2
  wanted "${name}_$n" || return 0
  stage "probe_${name}_$n" "$(left 560)" "^tokens=.*(gpu|dense rows)|^ {4} *[0-9].*(twell|hot_cold_gate|NNT)|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --tokens "$n" --top 40 --samples 5 "$@" \
    --out "$R/${name}_$n"
}
bench_b2() {  # label, extra bench arguments...: the recorded 1.5B forward at 4096 tokens, labelled bench_<label>
  local label=$1
  shift
  wanted "bench_$label" || return 0
  stage "model_forward_recorded_$label" "$(left 560)" "^\| forward|^total|Error" python3 -m twell.cli bench model \
    --preset 1.5b --parts forward --batch 2 --fused-norms --fused-residual --forward-policies default \
    --forward-compile --forward-compile-mode reduce-overhead "$@" --out "$R" --stem "model_forward_recorded_${label}_$S"
  forward_summary "$R/model_forward_recorded_${label}_$S.json"
}
# correctness first: the recorded-call GPU tests (cached_weights=True new in session 46), the dense-row tests
wanted gputests && stage pytest_gpu_recorded "$(left 560)" "passed|failed|error" python3 -m pytest -q -m gpu \
  tests/test_nn_mlp_hot_cold.py tests/test_ops_hot_cold_dense_rows.py -k "reduce_overhead or cuda_graph or gpu"
# most telling first (~60-120 s each; a stage past the call's budget is skipped): the A/B at both sizes, the bench's
# recorded forward, then a pass on every layer
probe severe0 4096 --severe-tiles 0
probe shipped 4096
probe severe0 8192 --severe-tiles 0
probe shipped 8192
bench_b2 b2
probe rows1 4096 --min-expected 1
# the split's weight copies read in place (static_dispatch(cached_weights=True), new in session 46 and not yet timed):
# predicted ~1-1.5 ms off the recorded sparse forward at both sizes (~54 MB written and read per layer and call)
probe cached 4096 --cached-weights
probe cached 8192 --cached-weights
bench_b2 b2_cached --forward-cached-weights
# above the eager floor (8937 tokens at 2048 x 5632), where eager calls run sparse and the pass's launches are host
# time: the rule off / shipped, eager wall clock beside the recorded one
probe severe0 12288 --severe-tiles 0
probe shipped 12288
call_end
