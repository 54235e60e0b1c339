#!/usr/bin/env bash
# Prepared in session 39 (no device time left for it): the decode tables again, now that the batch decode up kernel
# runs two warps at 2-16 tokens and one at 17-32 (2c8cb42; its op at d=2048 / 0.5 % 2.3-2.6 us faster at 2-32 tokens,
# decode_probe_call1_session39.log).  The shipped tables (sessions 34-35, `decode_<shape>_session3{4,5}_a.json`) came
# from the slower kernel, so they hold but may be narrower than the kernel allows.  Two calls of six shapes each
# (`twell tune-decode --rep-ms 50`, 28-39 s a shape in sessions 34-35):
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> PART=a bash scripts/gpu_pending_decode_retune.sh   # + 1536x8960 below 16
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> PART=b bash scripts/gpu_pending_decode_retune.sh
# Part a also runs scripts/gpu_pending_call1.sh's tunes (1536x8960 at 1-16 tokens, two seeds; session 39's ran on an
# H100) when the machine is an H200.  Predicted: at 2048x5632 the rows at 2-32 tokens reach higher densities (session
# 34: 1.40x at two tokens and 1.24x at eight at 1 %; the op ~10 % faster -> ~1.5x / ~1.35x, the limits up by ~0.5-2
# points of density), 64 tokens unchanged (four warps as before).  Runs on an H100 carry "h100" in their stems; their
# results belong under bench_results/h100/, not in the H200 tables.  tests/test_dispatch_table_provenance.py checks each
# shipped decode table against its shape's newest `decode_<shape>_session<N>_a.json` under bench_results/h200/, so
# commit the new runs with the tables `derive_decode_table` gives them (dispatch.H200_BF16_DECODE_TABLES).
. "$(dirname "$0")/gpu_call_lib.sh"
part=${PART:?set PART=a or PART=b}
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" "decode_$part"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
case $gpu in *H200*) tag="" ;; *H100*) tag="_h100" ;; *) tag="_other" ;; esac
echo "GPU: $gpu (stem tag '${tag}')"
case $part in
  a) shapes="2048x5632 4096x14336 2048x8192 1536x8960 896x4864 4096x11008" ;;
  b) shapes="3072x8192 2304x9216 2560x9728 1024x3072 5120x13824 3584x18944" ;;
  *) echo "PART must be a or b, not '$part'"; exit 2 ;;
esac
for shape in $shapes; do
  stage "tune_decode_$shape" "$(left 330)" "^decode table|<= M|python:|WRONG|ERROR|Error" \
    python3 -m twell.cli tune-decode --shape "$shape" --rep-ms 50 --out "$R" --stem "decode_${shape}${tag}_${S}_a"
done
if [ "$part" = a ] && [ -z "$tag" ]; then
  for seed in 0 1; do
    stage "tune_1536x8960_below16_s$seed" "$(left 570)" "<= M|DEFAULT_POLICY|WRONG|ERROR|Error" \
      python3 -m twell.cli tune-dispatch --shape 1536x8960 --ms 1 2 4 8 16 --seed "$seed" --out "$R" \
      --stem "dispatch_1536x8960_${S}_below16_s$seed"
  done
fi
call_end
