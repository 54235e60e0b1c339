#!/usr/bin/env bash
# Session 33, GPU call 3: decode_gated_ffn now runs 2-64 tokens through the batch kernels (be48c9e).  The whole GPU
# suite (the new batch-kernel GPU tests among it), then the decode probe again, whose "op" column is now the batch
# path: predicted equal to call 2's "batch" column (27.5 / 29.1 us at 2 / 8 tokens, d=2048, 0.5 %).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session33 3
stage pytest_gpu_all "$(left 480)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
stage decode_probe_after "$(left 570)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1,2,4,8,16,32,64
python3 - "$R/decode_probe_after_call3_session33.log" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    h = re.match(r"(d=\s*\d+ F=\s*\d+ M=\s*\d+ dens=\s*[\d.]+%)", line)
    if h:
        g = lambda pat: (re.search(pat, line) or [None, "-"])[1]
        print(h[1], "dense", g(r"dense ([\d.]+) hidden"), "op", g(r"down_um [\d.]+ op ([\d.]+)"),
              "dense/op", g(r"down_um [\d.]+ op [\d.]+ dense/op ([\d.]+)"), "batch", g(r"batch kernels: op ([\d.]+)"),
              "rel", g(r"\| rel (\S+) maxrel"), "repro", g(r"reproducible (\w+)"))
    elif "FAILED" in line:
        print(line.rstrip()[:300])
PY
call_end
