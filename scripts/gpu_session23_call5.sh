#!/usr/bin/env bash
# Session 23, GPU call 5: the cold-pairs bound of 13 from 131,072 tokens (hot_cold_plan.default_max_cold_l0) in the
# 1.5B forward, A/B in this process's children with --isolation none (the old bound through a python -c wrapper
# that sets HOT_MAX_COLD_L0_LARGE = 10), and the FFN sweep's 131,072-token row.  OUT, TWELL_COMMIT from the caller;
# the run folder is packed into $OUT/results_call5_session23.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session23
R="$OUT/run"
mkdir -p "$R"
M="bench model --preset 1.5b --parts forward --fused-norms --fused-rope --isolation none --out $R"
OLD="import sys; import twell.ops.hot_cold_plan as p; p.HOT_MAX_COLD_L0_LARGE = 10.0; from twell.cli import main; \
sys.exit(main(sys.argv[1:]))"
timeout 90 python3 -m twell.cli $M --stem model_forward_bound13_$S > "$R/model_forward_bound13_$S.log" 2>&1
echo "forward bound 13 rc=$?"
timeout 90 python3 -c "$OLD" $M --stem model_forward_bound10_$S > "$R/model_forward_bound10_$S.log" 2>&1
echo "forward bound 10 rc=$?"
rm -rf "$R"/*_parts
for v in bound13 bound10; do tail -4 "$R/model_forward_${v}_$S.log"; done
timeout 240 python3 -m twell.cli bench ffn --shape 2048x5632 --ms 131072 --out "$R" --stem ffn_m131072_$S \
  > "$R/ffn_m131072_$S.log" 2>&1
echo "sweep rc=$?"; grep "M=" "$R/ffn_m131072_$S.log" | sed 's/gate(twell).*hot-cold/hot-cold/'
tar czf "$OUT/results_call5_$S.tgz" -C "$OUT" run && rm -rf "$R"
