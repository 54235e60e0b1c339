#!/usr/bin/env bash
# The main job on a fresh machine: set up, then `twell demo` (trains a tiny ReLU-gated model on the
# Python standard library's own source, with and without L1, and reports sparsity, loss and speed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/twell demo "$@"
