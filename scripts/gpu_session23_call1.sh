#!/usr/bin/env bash
# Session 23, GPU call 1: the 1.5B forward's per-layer FFN times under several hot-set rules
# (scripts/forward_hot_sets.py), and the shared parts' probe with the residual add in cuBLAS's epilogue
# (scripts/attention_probe.py).  OUT from the caller; the logs are packed into $OUT/results_call1_session23.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session23
R="$OUT/run"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/environment_$S.txt" 2>&1
timeout 330 python3 scripts/forward_hot_sets.py --rules 0.013:7 0.013:13 0.013:16 0.013:20 0.013:none 0.018:10 \
  0.018:none 0.025:none 0.035:none 0.009:10 0.006:10 > "$R/forward_hot_sets_$S.log" 2>&1
echo "hot sets rc=$?"
tail -34 "$R/forward_hot_sets_$S.log"
timeout 150 python3 scripts/attention_probe.py > "$R/attention_probe_$S.log" 2>&1
echo "attention probe rc=$?"; cat "$R/attention_probe_$S.log"
tar czf "$OUT/results_call1_$S.tgz" -C "$OUT" run && rm -rf "$R"
