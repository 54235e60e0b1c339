#!/usr/bin/env bash
# Session 33, GPU call 5.  Call 4's ncu (caches flushed, eight tokens, d=2048, F=5632, 0.5 %): cuBLAS gate 9.0 us, up
# kernel 11.5, down kernel 6.8, partial sum 8.5-9.1 us for 16 programs whose loop over the 15 partials loaded one at a
# time.  Now the partial sum unrolled over S (all loads in flight) on 4x the programs, and the up, down and sum kernels
# launched as programmatic dependents (decode_batch_kernels.PDL).  Predicted under CUDA graphs at d=2048, 0.5 %:
# 27.5 / 29.1 us at 2 / 8 tokens -> ~25 / ~26 us (sum ~2 us less, PDL ~1 us); PDL off alone in the variants.  Then the
# 1.5B model's graphed decode at batch 8 ("decode" against dense; call 4's part hit its 180 s limit there).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session33 5
summary() {
  python3 - "$1" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    h = re.match(r"(d=\s*\d+ F=\s*\d+ M=\s*\d+ dens=\s*[\d.]+%)", line)
    if h:
        g = lambda pat: (re.search(pat, line) or [None, "-"])[1]
        print(h[1], "dense", g(r"dense ([\d.]+) hidden"), "op", g(r"down_um [\d.]+ op ([\d.]+)"),
              "batch", g(r"batch kernels: op ([\d.]+)"), "(up", g(r"up ([\d.]+), down"), "down", g(r"down ([\d.]+)\) dense") + ")",
              "rel", g(r"\| rel (\S+) maxrel"), "repro", g(r"reproducible (\w+)"), "union", g(r"union (\d+)"))
    elif line.startswith("batch d=") or "FAILED" in line:
        print(line.rstrip()[:1200])
PY
}
stage decode_probe_pdl "$(left 200)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1,2,4,8,16,32,64 --batch-variants \
  --variant-ms 8
summary "$R/decode_probe_pdl_call5_session33.log"
stage model_decode_b8 "$(left 540)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies decode \
  --decode-batches 8 --part-timeout 330 --out "$R" --stem model_decode_batch_kernels_b8_session33
call_end
