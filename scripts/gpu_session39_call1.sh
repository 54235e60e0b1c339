#!/usr/bin/env bash
# Session 39, call 1 (prepared in session 38 as its call 2, for which no machine came): the batch decode up kernel
# with session 38 call 1's winners (decode_batch_kernels.up_config: (256, 3, 2) at 1-16 tokens, (128, 3, 1) at 17-32,
# (128, 3, 4) at 33-64 as shipped), set in this machine's copy of the source before
# anything runs; they ship once these tests pass.  Predicted: the decode GPU tests pass; the
# probe's shipped "real" column at call 1's best (d=2048: ~7.4-7.8 us at 2 / 8 tokens, ~9.8 at 32); decode_probe's
# batch op at d=2048 / 0.5 % 2-3 us faster at 2-32 tokens than session 33's (28.6 / 30.4 / 30.4 us at 2 / 8 / 32), at
# 4096 x 14336 ~10 us faster at 8 tokens (105.6), unchanged at 64; the 1.5B model's graphed decode with the shipped
# policy 1.068x / 1.044x of dense at batch 2 / 8 (session 35) -> ~1.08-1.10x / ~1.05-1.06x.
# Stage limits sum to 420 s (session 38 had only ~420 s left for all of it; session 39 starts with 1800 s).
#   TWELL_SESSION=session39 TWELL_COMMIT=<sha> bash scripts/gpu_session39_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session39}" 1
python3 - <<'PY' || exit 1
import re
path = "src/twell/ops/decode_batch_kernels.py"
src = open(path).read()
new, n = re.subn(r"^_UP_CONFIG = \(.*\)$", "_UP_CONFIG = (256, 3, 2)", src, flags=re.M)
new, k = re.subn(r"^_UP_LARGE_M_CONFIG = \{.*\}$", "_UP_LARGE_M_CONFIG = {32: (128, 3, 1), 64: (128, 3, 4)}", new,
                 flags=re.M)
assert n == k == 1, (n, k)
open(path, "w").write(new)
print("set: _UP_CONFIG = (256, 3, 2), _UP_LARGE_M_CONFIG = {32: (128, 3, 1), 64: (128, 3, 4)}")
PY
stage pytest_gpu_decode "$(left 150)" "passed|failed|FAILED|Error" \
  python3 -m pytest tests -q -m gpu -k "decode or batch" -p no:cacheprovider
stage batch_up_probe "$(left 180)" "d=|FAILED|Error" python3 scripts/batch_up_probe.py
stage decode_probe "$(left 320)" "FAILED|Error" python3 scripts/decode_probe.py --ms 1,2,4,8,16,32,64
python3 - "$R/decode_probe_call1_$S.log" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    h = re.match(r"(d=\s*\d+ F=\s*\d+ M=\s*\d+ dens=\s*[\d.]+%)", line)
    if h:
        g = lambda pat: (re.search(pat, line) or [None, "-"])[1]
        print(h[1], "dense", g(r"dense ([\d.]+) hidden"), "op", g(r"down_um [\d.]+ op ([\d.]+)"),
              "dense/op", g(r"dense/op ([\d.]+) \|"), "batch", g(r"batch kernels: op ([\d.]+)"), "up", g(r"up ([\d.]+),"))
PY
stage model_decode "$(left 420)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies default \
  --decode-batches 2,8 --part-timeout 300 --out "$R" --stem "model_decode_${S}"
call_end
