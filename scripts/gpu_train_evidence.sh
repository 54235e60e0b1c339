#!/usr/bin/env bash
# Issue 6's GPU evidence in one call (<= 10 minutes on one H200): dense ReLU vs L1 vs L1 + dead-unit revival,
# ~100 M-parameter Llama-style model, same tokens, on the machine's installed Python sources; then the L1
# models' FFNs through the TwELL kernels on their own activations.  See src/twell/train/evidence.py.
#
#   OUT=/path/to/out bash scripts/gpu_train_evidence.sh [args of python -m twell.train.evidence]
#   OUT=/tmp/ev PYTHON=.venv/bin/python bash scripts/gpu_train_evidence.sh --scale cpu   # CPU rehearsal
#
# $OUT receives at most 8 files: summary.json, log.txt, evidence.tar.gz (everything: per-step logs, sparsity
# JSON and plots, activation patterns), and copies of training.png, l0_layers.png, speed.png.
# The Python run stops itself at --total-seconds (default 525 s from this script's start); `timeout` is the
# backstop (EVIDENCE_LIMIT_S, default 565 s) so that the archive is always written within 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
EVIDENCE_T0=$(date +%s.%N)
export EVIDENCE_T0 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
PYTHON=${PYTHON:-python3}
OUT=${OUT:-out}
LIMIT=${EVIDENCE_LIMIT_S:-565}
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/twell_evidence.XXXXXX")
{
  echo "twell train evidence: $(date -u +%FT%TZ), work dir $WORK, limit ${LIMIT}s"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total \
    --format=csv,noheader
  "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
} 2>&1 | tee "$OUT/log.txt"

timeout --signal=TERM --kill-after=10 "$LIMIT" "$PYTHON" -m twell.train.evidence --out "$WORK" "$@" 2>&1 \
  | tee -a "$OUT/log.txt"
rc=${PIPESTATUS[0]}
echo "evidence run exit status $rc ($(awk "BEGIN {print $(date +%s.%N) - $EVIDENCE_T0}") s)" | tee -a "$OUT/log.txt"

cp "$OUT/log.txt" "$WORK/log.txt"
[ -f "$WORK/summary.json" ] && cp "$WORK/summary.json" "$OUT/summary.json"
for f in training.png l0_layers.png speed.png; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f"; done
# Files over 16 MB do not come back from the GPU machine: the activation patterns go apart if need be.
tar -czf "$OUT/evidence.tar.gz" -C "$WORK" .
if [ "$(stat -c %s "$OUT/evidence.tar.gz")" -gt 15000000 ] && [ -d "$WORK/patterns" ]; then
  tar -czf "$OUT/patterns.tar.gz" -C "$WORK" patterns
  tar -czf "$OUT/evidence.tar.gz" -C "$WORK" --exclude=./patterns .
fi
ls -l "$OUT"
exit "$rc"
