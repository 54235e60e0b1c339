#!/usr/bin/env bash
# The second prepared GPU call (session 34's call 2, not run): `twell tune-decode` at the six measured shapes without a
# decode table; the 1.5B model's compiled, graphed greedy decode at batches 2 and 8 with the shipped policy, whose decode
# tables (six shapes, 2048x5632 among them) the decoder applies, against policy `decode` (every call of up to 64 tokens
# on the small-batch kernels).  Run it as
#   TWELL_SESSION=session36 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call2.sh
# Predicted: at batch 8 `default` >= `decode` (1.018x of dense in session 33): layer 0 (6.1 % generated l0) and any layer
# whose l0 estimate lies above its row's limit run dense, the others the batch kernels; ~1.02-1.04x of dense.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session36}" 2
for shape in 3072x8192 2304x9216 2560x9728 1024x3072 5120x13824 3584x18944; do
  stage "tune_decode_$shape" "$(left 250)" "^decode table|<= M|python:|WRONG|ERROR|Error" \
    python3 -m twell.cli tune-decode --shape "$shape" --rep-ms 50 --out "$R" --stem "decode_${shape}_${S}_a"
done
stage model_decode_tables "$(left 570)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies default,decode \
  --decode-batches 2,8 --part-timeout 300 --out "$R" --stem "model_decode_tables_${S}"
call_end
