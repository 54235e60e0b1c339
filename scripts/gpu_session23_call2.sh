#!/usr/bin/env bash
# Session 23, GPU call 2: the forward's per-layer FFN times under the hot-set rules, interleaved round by round
# (call 1's sequential grid drifted 3.7 % between the shipped rule's two runs), and the synthetic FFN's hot/cold op
# under wider cold-pairs bounds at the issue's points.  OUT from the caller; logs packed into
# $OUT/results_call2_session23.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session23
R="$OUT/run"
mkdir -p "$R"
timeout 300 python3 scripts/forward_hot_sets.py --reps 5 > "$R/forward_hot_sets_interleaved_$S.log" 2>&1
echo "hot sets rc=$?"
tail -32 "$R/forward_hot_sets_interleaved_$S.log"
timeout 200 python3 scripts/hot_threshold_probe.py --points 131072:28 16384:28 131072:56 16384:56 --thresholds \
  --bounds 13 16 20 > "$R/hot_bound_probe_$S.log" 2>&1
echo "bound probe rc=$?"; cat "$R/hot_bound_probe_$S.log"
tar czf "$OUT/results_call2_$S.tgz" -C "$OUT" run && rm -rf "$R"
