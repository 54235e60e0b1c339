#!/usr/bin/env bash
# Session 23, GPU call 4: where the forward's token overlap comes from (call 3: 64 consecutive tokens' active units
# union to 1.6-1.9 l0 at 1.5B / 64 x 2048 on the GPU; 9-19 l0 at 0.5B / 1 x 2048 on the CPU in fp32 and bf16):
# scripts/forward_unions.py with the transformers norms and rotary, and at 0.5B with one and 64 sequences.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session23
R="$OUT/run"
mkdir -p "$R"
U="scripts/forward_unions.py --no-errors --points"
timeout 120 python3 $U --plain > "$R/forward_unions_plain_$S.log" 2>&1; echo "1.5b plain rc=$?"
timeout 90 python3 $U --preset 0.5b --batch 1 > "$R/forward_unions_0.5b_b1_$S.log" 2>&1; echo "0.5b b1 rc=$?"
timeout 90 python3 $U --preset 0.5b --batch 1 --plain > "$R/forward_unions_0.5b_b1_plain_$S.log" 2>&1
echo "0.5b b1 plain rc=$?"
timeout 90 python3 $U --preset 0.5b > "$R/forward_unions_0.5b_b64_$S.log" 2>&1; echo "0.5b b64 rc=$?"
for f in "$R"/forward_unions_*; do echo "== $f"; grep -v "^NVIDIA" "$f" | cut -c1-110; done
