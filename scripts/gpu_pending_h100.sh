#!/usr/bin/env bash
# For an H100 (compute capability 9.0, like the H200): the shipped DEFAULT_POLICY holds its H200 tables to capability
# 9.0 (twell.nn.dispatch.HOPPER), so an H100 takes them without any H100 measurement behind them.  This call times them
# there: `twell tune-dispatch` at the headline shape (two runs) and at 4096x14336 (one), each printing how
# DEFAULT_POLICY fares on the points it timed.  Predicted: the H100's HBM3 (3.35 TB/s against the H200's 4.8) makes the
# dense GEMMs no slower (they are compute-bound from ~1024 tokens) and the cold gather, which is bound by L2 and
# memory, slower, so the large-call wins shrink (2.00x at 16,384 / 0.5 % on the H200 -> ~1.7-1.9x) and any loss,
# if there is one, sits at the table's edges (64-1023 tokens, the densest columns it sends sparse).
#   TWELL_SESSION=session38 TWELL_COMMIT=<sha> bash scripts/gpu_pending_h100.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session38}" h100
for run in "2048x5632 0" "2048x5632 1" "4096x14336 0"; do
  set -- $run
  stage "tune_h100_$1_s$2" "$(left 570)" "DEFAULT_POLICY|WRONG|ERROR|Error|lost|below" \
    python3 -m twell.cli tune-dispatch --shape "$1" --seed "$2" --out "$R" --stem "dispatch_$1_h100_${S}_s$2"
done
call_end
