"""When the sparse TwELL kernels beat the dense cuBLAS FFN: a per-call dispatch policy.

The sparse path wins when the activation is sparse enough for the saved up/down-projection work to
pay for the gate kernel's packing epilogue, and that break-even density depends on the token count:
at small M every path is launch- or weight-bandwidth bound and dense GEMMs are hard to beat, at large
M the FLOP saving dominates.  A :class:`DispatchPolicy` therefore holds a small table of rows
``(min_tokens, max_density)`` sorted by ``min_tokens``; for a call with ``M`` tokens the row with the
largest ``min_tokens <= M`` applies and the sparse path runs iff ``density <= max_density``.  Below the
first row the dense path runs.  ``density`` is the layer's l0 (mean active units per token) divided by
its intermediate size F.

The thresholds are measurements, not guesses: they come from ``twell tune-dispatch`` on the target GPU,
dtype and layer shape.  The shipped tables cover twelve layer shapes on an H200 in bf16
(:data:`H200_BF16_SHAPE_TABLES`).  A layer of another shape that lies between measured shapes (one no larger in
both sizes, one no smaller in both) follows the envelope of the nearest of them (:func:`bracketing_shapes`,
:func:`envelope_table`: at each token count the lowest limit their tables give, so it runs sparse only where every
one of them won); any other runs dense until it is measured.  On devices
the table was not measured for (by default everything but CUDA: on the CPU the pure-PyTorch sparse
reference is slower than dense matmuls) the policy answers dense, unless ``force`` is set, which applies
the table everywhere (tests, the Triton interpreter, benchmarks).  :data:`DEFAULT_POLICY` also names the GPUs its
tables hold for by compute capability (``capabilities``: Hopper), so a layer on any other CUDA GPU runs dense until
that GPU has its own table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

__all__ = ["DEFAULT_POLICY", "EAGER_MIN_FLOPS", "H200_BF16_896X4864_TABLE", "H200_BF16_1024X3072_TABLE",
           "H200_BF16_1536X8960_TABLE", "H200_BF16_2048X5632_TABLE", "H200_BF16_2048X8192_TABLE",
           "H200_BF16_2304X9216_TABLE",
           "H200_BF16_2560X9728_TABLE", "H200_BF16_3072X8192_TABLE", "H200_BF16_3584X18944_TABLE",
           "H200_BF16_4096X11008_TABLE", "H200_BF16_4096X14336_TABLE", "H200_BF16_5120X13824_TABLE",
           "H200_BF16_DECODE_TABLES", "H200_BF16_SHAPES", "H200_BF16_SHAPE_TABLES", "H200_BF16_TABLE",
           "HOPPER", "OTHER_SHAPES_RULES", "DispatchPolicy",
           "DispatchTable", "bracketing_shapes", "dense_ffn_flops", "density_of", "envelope_table"]

#: ``((min_tokens, max_density), ...)`` sorted by ``min_tokens``.
DispatchTable = tuple[tuple[int, float], ...]

#: What :class:`DispatchPolicy` does with a layer shape outside its ``shapes``: ``"dense"``, or ``"envelope"``
#: (the envelope of the tables of the measured shapes that bracket it, :func:`bracketing_shapes`; dense if none do).
OTHER_SHAPES_RULES = ("dense", "envelope")

#: Break-even table for bf16 on one H200 with SparseGatedMLP's hot/cold sparse path, first measured at
#: d=2048, F=5632 from bench_results/h200/ffn_hotcold.json (commit 3c34a03).  Through the module, M=4096 lost even at
#: 0.25 % density (0.89x: its Python and launch overhead, ~0.1 ms, is a quarter of the 0.43 ms dense FFN;
#: the op alone gave 1.21x); from 16384 tokens the hot/cold op won at every measured density up to 5 %
#: (1.56x at 0.25 %, 1.40x at 0.5 %, 1.17x at 1 %, 1.15x at 2 %, 1.06x at 5 %; at 131072 tokens 1.60x to
#: 1.10x), so the sparse path starts at 16384 tokens and up to 5 % density.  4096 x 14336 measured the
#: same in session 8 (DispatchPolicy's ``shapes`` note).  Since session 13 both measured shapes follow
#: their own tables below in :data:`DEFAULT_POLICY`; this one stays ``DispatchPolicy``'s default ``table``
#: (what a policy built with ``shapes=None`` applies to every shape).
H200_BF16_TABLE: DispatchTable = ((16384, 0.05),)

#: The 2048 x 5632 table from ``twell tune-dispatch`` (H200, bf16): the module held on its sparse path against
#: the dense module, call by call interleaved with a 2 ms hold, a row where every density up to its limit
#: won by >= 1.05x.  Rows from 16384 tokens: session 11 (commit 513fa3a, bench_results/h200/
#: dispatch_2048x5632_session11.json, 8 token counts x 9 densities, 0.25-10 %): sparse wins at every density
#: measured, 10 % included (1.19x at 16384, 1.13x at 131072).  Rows below: session 13 (commit 3bc72d4, after
#: the cold gather's rows-together loads, dispatch_2048x5632_session13_small_m.json, 1024-8192 tokens x the
#: same 9 densities): 2048 tokens at 0.25 % (1.24x; 0.5-10 % 0.90-1.04x), 4096 at every density (1.12-1.46x;
#: session 11 had 1.00x at 1 %), 8192 at every density (1.16-1.64x); 1024 lost everywhere (0.86-0.99x).
#: The sparse path only got faster between the two runs, so the rows from 16384 still hold.  Rows below
#: 16384 again in session 21 (commit 1a486c0, after session 20's hot-set rule and the module's l0 read
#: only when asked for, dispatch_2048x5632_session21_small_m.json, 1024-8192 tokens x 10 densities 0.25-10 %):
#: 1024 tokens now win to 1.5 % (1.05-1.21x; 2 % 0.92x), 2048 to 0.5 % (1.59x, 1.15x; 0.75-3 % 0.91-1.02x),
#: 4096 to 2 % (1.19-1.66x) but lose at 3 % (0.91x, 1.20x in session 13: the hot set there is session 20's
#: rule's, not measured further) and win again from 5 % (1.19-1.21x), so the row stops at 2 %; 8192 at every
#: density (1.15-1.95x).  The rows from 16384 were checked at the densities between session 11's points
#: (dispatch_2048x5632_session21_mid_densities.json: 16384 and 65536 tokens at 1.5 / 3 / 4 / 7.5 %:
#: 1.26-1.51x).  Each limit is the density the synthetic problem actually had at the last winning point
#: (l0 / F, e.g. 81.55 / 5632 at 1.5 % and 1024 tokens), rounded up in its 7th decimal, so the measured point
#: itself is inside; above 10 % nothing was measured.  Session 22's sweep (``twell bench ffn``, commit 642b089,
#: bench_results/h200/ffn_sweep_old_table_session22.json) sent 1024 tokens sparse and lost at every density it
#: covered: 0.85x / 0.66x / 0.67x at 0.25 / 0.5 / 1 % (module 0.140-0.179 ms against dense 0.119; session 21's
#: tuning had 0.099-0.114 ms for the sparse module there).  The op alone at 1024 tokens moved as much between two
#: runs on one machine (0.097-0.114 ms in ffn_small_m_session22.json, 0.142-0.180 in ffn_sweep_dispatch_session22
#: .json; bench_results/h200/session22_runs.md), so 1024 tokens go dense again (as after session 13), and 2048
#: keeps only 0.25 %, the one density that won in sessions 13 (1.24x), 21 (1.59x) and 22 (1.61x, 1.64x).
#: Session 28 re-tuned 2048-8192 tokens on the current op (commit 4aecd4a, bench_results/h200/
#: dispatch_2048x5632_session28_small_m.json): 2048 tokens won at 0.25 % (1.61x) and 0.5 % (1.16x; session 21:
#: 1.15x), tied or lost at 1-3 % (0.94-1.03x) and won at 5-10 % (1.18-1.20x), which alone would end its row at
#: 0.5 %; 4096 won to 2 % (1.23-1.69x), tied at 3 % (1.00x), won at 5-10 % (1.23-1.25x), and 8192 won at every
#: density (1.16-1.99x).  The losses at 1-3 % were the hot set's: with the cold-pairs bound 3 below 8192 tokens
#: (``hot_cold_plan.HOT_MAX_COLD_L0_SMALL``, call 2) and then as shipped (commit 62a3ef3, bench_results/h200/
#: dispatch_2048x5632_session28_small_bound.json) 2048 tokens won at every density (1.17-1.48x) and 4096 too
#: (1.23-1.80x), so both rows run to 10 %; 8192 unchanged (1.16-1.98x).  1024 tokens won there too (1.04-1.34x,
#: 1.05x or more to 2 %), but the op at that size moved by half from run to run in session 22, so it stays dense
#: until a second run agrees.  Session 29's second run (commit 837d453, bench_results/h200/
#: dispatch_2048x5632_session29_1024.json) agreed: 1.36x / 1.33x / 1.31x / 1.24x at 0.25-1.5 %, 1.03-1.08x from 2 %
#: (session 28: 1.34x / 1.32x / 1.27x / 1.06x, then 1.04-1.07x, 2 % at 1.049x); a third run, in session 29's call 2
#: (commit 349612a, dispatch_2048x5632_session29_shipped.json), read 1.39x / 1.32x / 1.21x at 0.25-1 % but 1.04x at
#: 1.5 % and 1.01-1.08x from 2 %.  The row runs 1024 tokens sparse to 1 %, where all three runs won by 1.21x or
#: more, at the highest of the three runs' densities there (0.00972626 in the third).  The same run's 10 % points
#: at 16,384 and 32,768 tokens (1.29x, 1.28x) lay above those rows' limits by draw (0.09965819 and 0.09985274
#: against 0.0996176 and 0.0998369), so session 29's sweep ran them dense (1.00x, ffn_sweep_session29.json):
#: those two limits now follow the later points.  Session 30 measured below 1024 tokens, two runs in two calls
#: (commit ab2658c / f946c5f, bench_results/h200/dispatch_2048x5632_session30_tiny{,_b}.json, 1-512 tokens x the same 9
#: densities): one token won at every density in both (1.13-1.18x; the module's hot/cold op at one token against the
#: dense FFN's five kernels), so its row runs to the 10 % point's own density (5.59 %: 315 of 5632 units in that
#: one token); 16 and 64 tokens won by 1.05x at some densities in one run and not the other (0.86-1.17x), 256 tokens
#: nowhere (0.91-1.02x), so 16-511 tokens stay dense (a row of limit 0); 512 tokens won to 1 % in both (1.16-1.26x;
#: 1.5 %: 0.91x / 0.92x).  ``twell tune-dispatch --from`` both runs derives these rows
#: (dispatch_2048x5632_session30_below1024_merged_policy.json).  The sweep at the shipped table
#: (ffn_sweep_session30.json): one token 1.13-1.17x.  Session 35 timed 1, 2, 4, 8 and 16 tokens in two more runs
#: (commit 48084c8, dispatch_2048x5632_session35_below16_s{0,1}.json): 2 tokens won at every density in both
#: (1.07-1.18x), 4 tokens to 1.5 % (1.10-1.18x; 2 %: 1.03 / 1.13x), 8 tokens to 1.5 % (1.11-1.16x; 2 %: 0.98 / 0.98x),
#: 16 tokens again nowhere; one token again everywhere, and its row now runs to the highest density drawn there in
#: the four runs (7.95 %).  3 tokens take 4 tokens' limit, 9-15 tokens 16's (dense): the rule between measured
#: counts (:mod:`twell.nn.dispatch_tuning`).  ``twell tune-dispatch --from`` the four runs derives these rows
#: (dispatch_2048x5632_session35_below1024_merged_policy.json).
H200_BF16_2048X5632_TABLE: DispatchTable = (
    (1, 0.0795455), (2, 0.0602806), (3, 0.0128729), (8, 0.0192650), (9, 0.0), (512, 0.0099516), (1024, 0.0097263),
    (2048, 0.0982466), (4096, 0.0987608), (8192, 0.0993416), (16384, 0.0996582), (32768, 0.0998528),
    (65536, 0.0997857), (131072, 0.0998256),
)


#: 4096 x 14336 (H200, bf16): ``twell tune-dispatch --shape 4096x14336``, session 14 (commit 8695a49, two calls:
#: 4096-32768 tokens, then 65536 and 131072, 8 densities 0.25-10 %; bench_results/h200/
#: dispatch_4096x14336_session14.json, merged from _s14_a.json and _s14_b.json), the module held sparse against
#: the dense module, interleaved with a 2 ms hold.  From 8192 tokens sparse wins at every density measured
#: (8192: 1.18-1.52x; 16384-131072: 1.14-2.05x, the lowest 1.14x at 65536 / 1 %); 4096 tokens win at 0.25 % and
#: 0.5 % (1.44x, 1.18x), lose at 1 % (0.91x) and win again from 2 % (1.04-1.22x), so the row stops at 0.5 %.
#: Limits: the last winning point's own density rounded up in its 7th decimal, as for 2048 x 5632.  (Until
#: session 13 this shape followed H200_BF16_TABLE, then a table from session 8's sweep points, sparse from
#: 16384 tokens to 5 %.)  Session 30 re-tuned it on the current op (sessions 20-29 changed the hot set's rule,
#: measured only at 2048 x 5632): call 1 (commit 5cb88a7, bench_results/h200/dispatch_4096x14336_session30_{small,mid,
#: large}.json) won at every point from 1024 to 131,072 tokens and 0.25 % to 10 % (1.19-2.29x; 4096 tokens at 1 %,
#: 0.91x in session 14, now 1.31x); calls 2 and 3 (commits ab2658c / f946c5f, dispatch_4096x14336_session30_tiny{,_b}
#: .json, 1-1024 tokens, two runs that agree within 0.06x) won at every density at 1-64 and 512-1024 tokens
#: (1.09-1.66x: at these sizes the dense FFN reads the whole 352 MB of weights, the sparse path the active rows), and
#: at 256 tokens only to 0.5 % (1.50x, 1.08x; 0.94-1.03x from 1 %).  Each limit is the last winning point's own
#: density, as above (the one-token row's 14.4 % is that token's 2059 of 14336 units at the 10 % target);
#: ``twell tune-dispatch --from`` the five runs derives the whole table (dispatch_4096x14336_session30_merged_policy
#: .json).  Since session 35, 65-255 tokens take 256 tokens' limit (0.5 %), not 64 tokens' 10 %: 256 tokens lost
#: above 0.5 %, and the counts between were not timed (:mod:`twell.nn.dispatch_tuning`).
H200_BF16_4096X14336_TABLE: DispatchTable = (
    (1, 0.1436245), (16, 0.1010961), (64, 0.0978209), (65, 0.0047750), (512, 0.0970267), (1024, 0.0994713),
    (2048, 0.0991786), (4096, 0.1001101), (8192, 0.0996234), (16384, 0.1000298), (32768, 0.1000031), (65536, 0.1001733),
    (131072, 0.1001610),
)


#: Four more layer shapes, measured on the H200 in session 31 (bf16, ``twell tune-dispatch``, two runs of each with
#: their own draws of the synthetic activations, seeds 0 and 1, 1 to 131,072 tokens x 0.25 / 0.5 / 1 / 2 / 5 / 10 %;
#: commits aeff572 / c1fcf39 / 4f82cee, bench_results/h200/dispatch_<shape>_session31_{a,b}.json, 896 x 4864's second
#: run from call 3: _b2.json).  A point joins a table only where both runs won by >= 1.05x, and each limit is the
#: higher of the two runs' drawn densities at the last such point, rounded up in its 7th decimal
#: (``twell tune-dispatch --from``, dispatch_<shape>_session31_merged_policy.json; tests/test_dispatch_table_provenance
#: .py holds the rows to those files).  Token counts between two measured ones follow the lower: 65,536 tokens was not
#: measured (the tables' row from 32,768 covers it), nor anything between the powers of two listed.  Since session 35 a
#: count between two measured ones takes the larger one's limit where that one lost inside the smaller one's row
#: (:mod:`twell.nn.dispatch_tuning`): hence the rows from 2, 17 and 65 tokens, where the smaller count won more.
#:
#: Below, "to x %" names the last density target that won in both runs, "a-b" the range of both runs' speedups over
#: the targets a row covers, and "t %: p / q" the two runs' speedups at the first target that did not win in both.
#:
#: 4096 x 11008 (Llama-2-7B's FFN): 1 and 16 tokens to 10 % (1.36-1.50x, 1.07-1.45x), 64 tokens to 5 % (1.07-1.41x;
#: 10 %: 1.08 / 1.05x, the second under the margin), 256 tokens to 0.5 % (1.06-1.36x; 1 %: 1.14 / 1.02x), 512 tokens to
#: 1 % (1.08-1.30x; 2 %: 0.98 / 0.92x), from 1024 tokens to 10 % (1.14-1.47x at 1024, 1.26-2.31x from 2048).
H200_BF16_4096X11008_TABLE: DispatchTable = (
    (1, 0.1105560), (16, 0.1087164), (17, 0.0500943), (65, 0.0054261), (512, 0.0099718), (1024, 0.1005939),
    (2048, 0.1008304), (4096, 0.0999277), (8192, 0.1000245), (16384, 0.1000916), (32768, 0.1002504),
    (131072, 0.0999534),
)

#: 2048 x 8192 (Llama-3.2-1B's FFN): one token to 10 % (1.26-1.37x), 16 tokens to 2 % (1.08-1.30x; 5 %: 1.07 / 0.99x),
#: 64 tokens to 1 % (1.09-1.17x; 2 %: 0.99 / 1.06x), dense at 256-1023 tokens (0.25 %: 1.00 / 1.12x at 256, 0.93 / 1.15x
#: at 512), from 1024 tokens to 10 % (1.06-1.46x at 1024, 1.27-2.31x from 2048).
H200_BF16_2048X8192_TABLE: DispatchTable = (
    (1, 0.0797120), (2, 0.0209351), (64, 0.0109463), (65, 0.0), (1024, 0.0991935), (2048, 0.1002816),
    (4096, 0.0996992), (8192, 0.1002152), (16384, 0.1002475), (32768, 0.0998980), (131072, 0.1000183),
)

#: 1536 x 8960 (Qwen2-1.5B's FFN): one token to 10 % (1.30-1.41x), 16 and 64 tokens to 2 % (1.13-1.39x; 1.06-1.27x; 5 %:
#: 0.98 / 1.07x and 1.03 / 0.99x), dense at 256 tokens (0.25 %: 0.91 / 1.00x), 512 tokens at 0.25 % only (1.05 / 1.18x;
#: 0.5 %: 1.00 / 1.19x), from 1024 tokens to 10 % (1.20-1.64x at 1024, 1.25-2.26x from 2048).
H200_BF16_1536X8960_TABLE: DispatchTable = (
    (1, 0.1021206), (2, 0.0182966), (64, 0.0218227), (65, 0.0), (512, 0.0025243), (1024, 0.1013057),
    (2048, 0.1001734), (4096, 0.1005238), (8192, 0.1003812), (16384, 0.1001218), (32768, 0.1001298),
    (131072, 0.1000652),
)

#: 896 x 4864 (Qwen2-0.5B's FFN): one token to 10 % (1.05-1.20x), 16 tokens at 0.25 % only (1.19 / 1.07x; 0.5 %: 0.94 /
#: 1.15x), dense at 64-2047 tokens (0.25 %: 1.02 / 1.02x at 64, 0.84 / 0.62x at 256, 0.74 / 0.85x at 512, 1.03 / 0.98x
#: at 1024, where 0.5-10 % won in both runs, 1.14-1.28x), from 2048 tokens to 10 % (1.29-1.60x at 2048, 1.35-2.23x from
#: 4096).  The second run's one-token point at 0.25 % read a relative error of 6.0e-3, the dense bf16 module's own on
#: that token (``twell.tolerances.DENSE_ERROR_FACTOR``); call 3 repeated that run with the dense error recorded.
H200_BF16_896X4864_TABLE: DispatchTable = (
    (1, 0.1124589), (2, 0.0025957), (64, 0.0), (2048, 0.0991320), (4096, 0.1000616), (8192, 0.1004460),
    (16384, 0.1003094), (32768, 0.1001757), (131072, 0.1003189),
)

#: Six more, measured on the H200 in session 32 the same way (two runs, seeds 0 and 1, the same token counts and
#: densities; commits 342ee1e / 8c2c8e0 / 7725a95, bench_results/h200/dispatch_<shape>_session32_{a,b}.json, merged in
#: dispatch_<shape>_session32_merged_policy.json).  The first three lay between the six shapes above and were run to
#: check the envelope rule on shapes it had not seen: the envelope of all six tables sent 33-36 of each one's 72 points
#: sparse, and every one of them won in both runs, by 1.17x or more.  The other three extend the measured sizes.  (The
#: rule as shipped, and its check with each measured shape left out in turn: ``ENVELOPE_BRACKET_MIN_TOKENS``.)  Same
#: notation, and the same rule between measured counts, as above.
#:
#: 3072 x 8192 (Llama-3.2-3B's FFN): one token to 10 % (1.21-1.27x), 16 tokens dense (0.25 %: 0.94 / 1.21x; 10 %:
#: 0.36 / 0.90x), 64 tokens to 2 % (1.06-1.22x; 5 %: 0.95 / 0.99x), dense at 256-1023 tokens (0.25 %: 1.04 / 1.11x at
#: 256, 0.88 / 0.91x at 512), from 1024 tokens to 10 % (1.05-1.35x at 1024, 1.17-2.08x from 2048).
H200_BF16_3072X8192_TABLE: DispatchTable = (
    (1, 0.0876465), (2, 0.0), (64, 0.0193406), (65, 0.0), (1024, 0.0999796), (2048, 0.1004988),
    (4096, 0.1001206), (8192, 0.1003620), (16384, 0.1000374), (32768, 0.1000772), (131072, 0.1001666),
)

#: 2304 x 9216 (Gemma-2-2B's FFN): one token to 10 % (1.26-1.35x), 16 tokens to 1 % (1.05-1.34x; 2 %: 1.25 / 1.01x), 64
#: tokens to 2 % (1.08-1.26x; 5 %: 1.02 / 0.96x), dense at 256-1023 tokens (0.25 %: 1.05 / 0.93x at 256 and 1.05 / 0.85x
#: at 512), from 1024 tokens to 10 % (1.06-1.28x at 1024, 1.21-2.01x from 2048).
H200_BF16_2304X9216_TABLE: DispatchTable = (
    (1, 0.0837674), (2, 0.0107558), (64, 0.0188955), (65, 0.0), (1024, 0.1033604), (2048, 0.1007242),
    (4096, 0.1005392), (8192, 0.1001825), (16384, 0.0999489), (32768, 0.1003522), (131072, 0.1000810),
)

#: 2560 x 9728 (Qwen3-4B's FFN): one token to 10 % (1.18-1.37x; the 10 % target drew 27 % of the units on that
#: token), 16 tokens to 1 % (1.16-1.32x; 2 %: 1.26 / 0.97x), 64 tokens to 2 % (1.10-1.31x; 5 %: 1.07 / 1.05x), dense at
#: 256-1023 tokens (0.25 %: 0.74 / 1.15x at 256, 1.19 / 1.02x at 512), from 1024 tokens to 10 % (1.26-1.52x at 1024,
#: 1.27-2.04x from 2048).
H200_BF16_2560X9728_TABLE: DispatchTable = (
    (1, 0.2712788), (2, 0.0133443), (64, 0.0206348), (65, 0.0), (1024, 0.1009091), (2048, 0.1000367),
    (4096, 0.1004718), (8192, 0.1004184), (16384, 0.1004614), (32768, 0.0999921), (131072, 0.1000048),
)

#: 1024 x 3072 (Qwen3-0.6B's FFN), the smallest: one token to 5 % (1.05-1.11x; 10 %: 0.98 / 1.08x), 16 tokens at 0.25 %
#: only (1.09 / 1.10x; 0.5 %: 1.09 / 0.92x), dense at 64-1023 tokens (0.64-1.03x), 1024 tokens to 1 % (1.15-1.28x; 2 %:
#: 0.97 / 0.99x), 2048 to 0.5 % (1.07-1.24x; 1 %: 1.10 / 1.04x), 4096 to 10 % (1.19-1.59x), 8192 to 0.5 % (1.48-1.82x;
#: 1 %: 0.92 / 0.94x, 2 %: 0.78 / 1.00x, then 1.23-1.26x at 5-10 %), 16,384 to 1 % (1.26-1.93x; 2 %: 1.03 / 1.22x), from
#: 32,768 tokens to 10 % (1.19-2.08x).  The dips at 8192-16,383 tokens are the hot set's middle tier
#: (``hot_cold_plan.HOT_MAX_COLD_L0``, 10 cold pairs per token): at 8192 tokens / 1 % its 320 hot units took 0.345 ms
#: against 0.112 ms with the small tier's 1152 at 4096 tokens (ffn_1024x3072_tier_session32.json), and bound 3 through
#: the middle tier read 1.43x there against the shipped 0.81x (dispatch_1024x3072_session32_mid_bound3.json), but lost
#: at 2048 x 5632 (16,384 tokens / 0.5 %: 1.71x against 2.00x) and 896 x 4864 (16,384 / 32,768 tokens at 1 %: 1.59x /
#: 1.57x against 1.74x / 1.74x), so it is not shipped.
H200_BF16_1024X3072_TABLE: DispatchTable = (
    (1, 0.0507813), (2, 0.0020142), (64, 0.0), (1024, 0.0100009), (2048, 0.0051078), (4096, 0.1009508),
    (4097, 0.0050447), (16384, 0.0100350), (32768, 0.1002127), (131072, 0.0999843),
)

#: 5120 x 13824 (Llama-2-13B's and Qwen2.5-14B's FFN): 1-64 tokens to 10 % (1.48-1.70x, 1.11-1.68x, 1.10-1.61x), 256 and
#: 512 tokens at 0.25 % only (1.52-1.53x, 1.29-1.39x; 0.5 %: 1.05 / 1.05x and 0.98 / 1.09x), from 1024 tokens to 10 %
#: (1.10-1.36x at 1024, 1.20-2.00x from 2048).
H200_BF16_5120X13824_TABLE: DispatchTable = (
    (1, 0.1447483), (16, 0.0854583), (64, 0.1024340), (65, 0.0025666), (512, 0.0025531), (1024, 0.1012810),
    (2048, 0.1003916), (4096, 0.1003197), (8192, 0.1000236), (16384, 0.1002228), (32768, 0.1001727),
    (131072, 0.1000622),
)

#: 3584 x 18944 (Qwen2-7B's FFN): 1-64 tokens to 10 % (1.66-1.87x, 1.18-1.80x, 1.16-1.78x), 256 tokens to 1 %
#: (1.09-1.23x; 2 %: 1.047 / 1.074x), from 512 tokens to 10 % (1.06-1.43x at 512, 1.11-1.65x at 1024, 1.25-2.26x from
#: 2048).
H200_BF16_3584X18944_TABLE: DispatchTable = (
    (1, 0.1241027), (16, 0.1181674), (64, 0.1030901), (65, 0.0098964), (512, 0.0992873), (1024, 0.0999708),
    (2048, 0.0997803), (4096, 0.1000783), (8192, 0.0997739), (16384, 0.1002495), (32768, 0.1002530),
    (131072, 0.1000201),
)

#: Every table above by its layer shape ``(hidden_size, intermediate_size)``: what :data:`DEFAULT_POLICY` applies.
H200_BF16_SHAPE_TABLES: tuple[tuple[tuple[int, int], DispatchTable], ...] = (
    ((2048, 5632), H200_BF16_2048X5632_TABLE),
    ((4096, 14336), H200_BF16_4096X14336_TABLE),
    ((4096, 11008), H200_BF16_4096X11008_TABLE),
    ((2048, 8192), H200_BF16_2048X8192_TABLE),
    ((1536, 8960), H200_BF16_1536X8960_TABLE),
    ((896, 4864), H200_BF16_896X4864_TABLE),
    ((3072, 8192), H200_BF16_3072X8192_TABLE),
    ((2304, 9216), H200_BF16_2304X9216_TABLE),
    ((2560, 9728), H200_BF16_2560X9728_TABLE),
    ((1024, 3072), H200_BF16_1024X3072_TABLE),
    ((5120, 13824), H200_BF16_5120X13824_TABLE),
    ((3584, 18944), H200_BF16_3584X18944_TABLE),
)
#: The layer shapes measured on the H200: :class:`DispatchPolicy`'s default ``shapes``.
H200_BF16_SHAPES: tuple[tuple[int, int], ...] = tuple(shape for shape, _ in H200_BF16_SHAPE_TABLES)


def _check_table(table: object) -> DispatchTable:
    """Normalise ``table`` to a tuple of ``(int, float)`` rows and check it; raise with the bad row named."""
    if isinstance(table, (str, bytes)) or not hasattr(table, "__iter__"):
        raise TypeError(f"table must be a sequence of (min_tokens, max_density) rows, got {type(table).__name__}")
    rows: list[tuple[int, float]] = []
    for i, row in enumerate(table):  # type: ignore[union-attr]
        try:
            min_tokens, max_density = row
        except (TypeError, ValueError):
            raise ValueError(f"table row {i} must be a pair (min_tokens, max_density), got {row!r}") from None
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int):
            raise TypeError(f"table row {i}: min_tokens must be an int, got {type(min_tokens).__name__}")
        if min_tokens < 0:
            raise ValueError(f"table row {i}: min_tokens must be >= 0, got {min_tokens}")
        if isinstance(max_density, bool) or not isinstance(max_density, (int, float)):
            raise TypeError(f"table row {i}: max_density must be a float, got {type(max_density).__name__}")
        if not 0.0 <= float(max_density) <= 1.0:  # also refuses NaN
            raise ValueError(f"table row {i}: max_density must lie in [0, 1], got {max_density}")
        if rows and min_tokens <= rows[-1][0]:
            raise ValueError(
                f"table rows must be sorted by strictly increasing min_tokens; row {i} has min_tokens={min_tokens} "
                f"after {rows[-1][0]}"
            )
        rows.append((min_tokens, float(max_density)))
    return tuple(rows)


def check_capabilities(capabilities: object) -> tuple[tuple[int, int], ...] | None:
    """``capabilities`` as a tuple of ``(major, minor)`` int pairs (or None); a TypeError names anything else."""
    if capabilities is None:
        return None
    try:
        pairs = tuple(tuple(c) for c in capabilities)  # type: ignore[union-attr]
    except TypeError:
        pairs = None
    if pairs is None or not all(len(c) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in c)
                                for c in pairs):
        raise TypeError(f"capabilities must be None or (major, minor) int pairs such as ((9, 0),), got "
                        f"{capabilities!r}")
    return pairs  # type: ignore[return-value]


def capability_allowed(capabilities: tuple[tuple[int, int], ...] | None, device_type: str,
                       capability: tuple[int, int] | None) -> bool:
    """Whether tables held to ``capabilities`` apply on a ``device_type`` device of compute ``capability``: off CUDA,
    and where either is None (no limit, or a caller that does not know), they are not held back."""
    return device_type != "cuda" or capabilities is None or capability is None or tuple(capability) in capabilities


def dense_ffn_flops(tokens: int, shape: tuple[int, int]) -> int:
    """Floating-point operations of the dense gated FFN on ``tokens`` tokens of a layer of ``shape`` ``(hidden_size,
    intermediate_size)``: its three GEMMs, 2 x tokens x d x F each (the unit of ``DispatchPolicy.eager_min_flops``)."""
    return 6 * int(tokens) * int(shape[0]) * int(shape[1])


@dataclass(frozen=True)
class DispatchPolicy:
    """Decides per call whether a sparse gated FFN runs the TwELL kernels or the dense path.

    Attributes:
        table: rows ``(min_tokens, max_density)`` sorted by strictly increasing ``min_tokens`` (see the
            module docstring).  An empty table means always dense.
        device_types: the device types the table was measured for; elsewhere the answer is dense.
        force: apply the table on every device type and layer shape (tests, the interpreter, benchmarks).
        decode_max_tokens: calls of 1 to this many tokens (at most :data:`twell.ops.DECODE_MAX_TOKENS`)
            take the small-batch kernels of :mod:`twell.ops.decode` whatever the density (they read Wg
            whole and Wu, Wd only at firing units); 0 (the default) leaves such calls to the table.
            Measured on an H200 (bf16, CUDA-graph GPU time, bench_results/h200/decode_probe_onepass_*
            session6.log: the one-pass kernel's, m124 for two tokens, v1 for eight): one token per
            call (the one-pass kernel) ran 1.78x of the dense chain at 2048 x 5632 and 0.5 % density,
            1.45x at 2 %, 2.01x at 4096 x 14336 (0.5 %); two tokens 0.93x, eight 0.55-0.83x; called
            eagerly, where the host's launches dominate, one token ran 0.60x at 2048 x 5632.  Since
            session 33 calls of 2-64 tokens take the batch kernels (:mod:`twell.ops.decode_batch_kernels`;
            bench_results/h200/decode_probe_final_call6_session33.log): 1.20-1.26x of dense at 2-16 tokens
            and 0.5 % at 2048 x 5632 but 0.87x at 64 tokens and 2 %, 1.73x at two tokens and 0.68x at 64
            tokens and 2 % at 4096 x 14336, so whether they pay depends on density and tokens, which this
            single bound does not see; the 1.5B model's graphed decode step gained 1.009x at batch 2 and
            1.018x at batch 8 with ``decode_max_tokens=64`` (model_decode_batch_kernels_session33.json,
            model_decode_batch_kernels_b8_session33.json).  So ``decode_max_tokens=1`` pays only in a
            graphed decode step (:class:`twell.generation.GreedyDecoder` turns it on for its calls by
            default), and the default stays 0; since session 34 graphed calls of 2-64 tokens follow
            ``decode_tables``, which see the density too.  Subject to ``device_types`` and ``shapes`` like the table.
        shapes: the layer shapes ``(hidden_size, intermediate_size)`` the table was measured for (by
            default the twelve of :data:`H200_BF16_SHAPES`), or None for a table that holds for any shape.
            Break-even densities move with the shape, so a layer of an unmeasured shape gets the dense
            path.  4096 x 14336 joined in session 8 (H200, the hot/cold op with the fused gate,
            bench_results/h200/ffn_large_session8_a.json and _b.json): at M=16384 / 131072 1.52x / 1.57x
            (0.5 %), 1.30x / 1.35x (1 %), 1.24x / 1.23x (2 %), 1.25x / 1.27x (5 %); M=4096 lost (0.88x
            at 0.5 %), so the same table holds; the plain TwELL path had lost there (0.78x at 131072).
        shape_tables: ``((hidden_size, intermediate_size), table)`` pairs: a layer of a listed shape
            follows its own table instead of ``table`` (still subject to ``device_types`` and
            ``shapes``).  Empty by default; :data:`DEFAULT_POLICY` gives each of the twelve measured shapes
            the table ``twell tune-dispatch`` measured for it (:data:`H200_BF16_SHAPE_TABLES`).
        other_shapes: what a layer shape outside ``shapes`` gets (one of :data:`OTHER_SHAPES_RULES`):
            ``"dense"`` (the default), or ``"envelope"``: where measured shapes (the ``shape_tables`` shapes in
            ``shapes``) bracket it (:func:`bracketing_shapes`), it follows :func:`envelope_table` of the
            bracketing shapes' tables, sparse only at token counts and densities where every one of them is;
            where none do, dense.  :data:`DEFAULT_POLICY` uses ``"envelope"``.
        decode_tables: ``((hidden_size, intermediate_size), table)`` pairs whose rows ``(min_tokens, max_density)``
            (``min_tokens`` from 1 to :data:`twell.ops.DECODE_MAX_TOKENS`) say where a layer of that shape takes
            the small-batch kernels when ``decode_graphed`` is set: a call of up to ``DECODE_MAX_TOKENS`` tokens
            whose density is at most the limit of the row that applies (``twell tune-decode`` measures them under
            CUDA graphs).  :data:`DEFAULT_POLICY` holds the H200 ones (:data:`H200_BF16_DECODE_TABLES`).
        decode_graphed: the calls run inside a recorded CUDA graph, where the small-batch kernels' launches cost
            no host time, so ``decode_tables`` apply, and a layer whose shape has a decode table runs its calls of up
            to ``DECODE_MAX_TOKENS`` tokens on the small-batch kernels or dense, never the table's TwELL path; eagerly
            those launches cost more host time than the dense chain's (0.60x at one token, 2048 x 5632), so the
            default is False and :class:`twell.generation.GreedyDecoder` sets it for its calls.  Subject to
            ``device_types``.
        capabilities: the CUDA compute capabilities ``(major, minor)`` the tables hold for, or None (the default)
            for any: a CUDA device of another capability gets the dense path (unless ``force``).
            :data:`DEFAULT_POLICY` holds its H200 tables to Hopper, ``((9, 0),)``: below it the fused gate (TMA)
            is not built, so the sparse path runs cuBLAS's gate and a separate pack and its break-even points move,
            and built for sm_75 the gate kernel's epilogue spills 31,108 bytes a thread
            (bench_results/offline_pre_hopper/compile_check_sm75_session37.json).  Other GPUs measure their own
            table with ``twell tune-dispatch``.
        eager_min_tokens: eager calls (``eager=True``: whose launches the host issues one call at a time, eagerly
            or from a graph traced by torch.compile outside :func:`twell.nn.static_dispatch`; neither inside that
            context nor recorded in a CUDA graph) of fewer tokens take the dense path; 0 (the default) sets no
            floor.  Compiled calls count since session 45: the 1.5B backbone in inductor's default mode at 4096
            tokens ran 0.794x of compiled dense with the tables alone (H100 machine,
            bench_results/h100/model_forward_b2_session45.json).  The tables are timed with the host ahead of the
            GPU, as in a model whose host runs ahead; a caller whose host is the bottleneck pays each call's host
            time instead, where the hot/cold op's 442-957 us stand against the dense chain's 76-119 us (H100 host,
            session 40, bench_results/h200/session40_runs.md), so below some token count such a caller gains from
            dense.  ``twell tune-dispatch --eager`` measures it for one layer shape on the machine that serves.
        eager_min_flops: the same floor for every layer shape at once, in work: eager calls whose dense FFN
            would take fewer floating-point operations than this (``6 * tokens * hidden_size *
            intermediate_size``, its three GEMMs) take the dense path; 0 sets none.  An eager sparse call costs its
            host's issuing (0.46-0.90 ms whatever its size in session 43) until the GPU work outgrows it, and the
            dense FFN's time grows with this product, so the break-even token count falls as the layer grows.
            :data:`DEFAULT_POLICY` sets :data:`EAGER_MIN_FLOPS` (6.18e11, 8937 tokens at 2048 x 5632), derived from
            the layer and model runs its comment names.  Applies where the call's ``shape`` is known; the floor in
            tokens for a shape is :meth:`eager_floor_tokens`.

    The policy is a frozen (hashable) value object so that many layers can share one instance and a
    decision never depends on hidden state: ``use_sparse`` is a pure function of its arguments.
    """

    table: DispatchTable = H200_BF16_TABLE
    device_types: tuple[str, ...] = ("cuda",)
    force: bool = False
    shapes: tuple[tuple[int, int], ...] | None = H200_BF16_SHAPES
    decode_max_tokens: int = 0
    shape_tables: tuple[tuple[tuple[int, int], DispatchTable], ...] = ()
    other_shapes: str = "dense"
    decode_tables: tuple[tuple[tuple[int, int], DispatchTable], ...] = ()
    decode_graphed: bool = False
    capabilities: tuple[tuple[int, int], ...] | None = None
    eager_min_tokens: int = 0
    eager_min_flops: float = 0.0
    # Derived in __post_init__ from shape_tables, shapes and other_shapes (so not compared or hashed on its own): the
    # measured (shape, table) pairs an envelope is made of; empty where other_shapes is "dense".
    _measured: tuple[tuple[tuple[int, int], DispatchTable], ...] = field(init=False, repr=False, compare=False,
                                                                         default=())
    # (hidden_size, intermediate_size) -> (bracketing shapes, their envelope table), filled on first use: worked out
    # afresh, use_sparse took 75 us per call on this project's CPU for a shape between the twelve H200 tables; cached
    # 6.6 us, against 2.7 us for a measured shape.
    _envelopes: dict = field(init=False, repr=False, compare=False, default_factory=dict)
    # twell.ops.DECODE_MAX_TOKENS, read once in __post_init__ so that the per-call decisions (which torch.compile
    # traces) import nothing.
    _decode_max: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", _check_table(self.table))
        if isinstance(self.device_types, str) or not all(isinstance(t, str) for t in self.device_types):
            raise TypeError(f"device_types must be a tuple of device type strings, got {self.device_types!r}")
        object.__setattr__(self, "device_types", tuple(self.device_types))
        if not isinstance(self.force, bool):
            raise TypeError(f"force must be a bool, got {type(self.force).__name__}")
        if self.shapes is not None:
            try:
                shapes = tuple((int(h), int(f)) for h, f in self.shapes)
            except (TypeError, ValueError):
                raise TypeError(
                    f"shapes must be None or pairs (hidden_size, intermediate_size), got {self.shapes!r}"
                ) from None
            object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "shape_tables", _check_shape_tables(self.shape_tables))
        from ..ops.decode_kernels import DECODE_MAX_TOKENS

        object.__setattr__(self, "_decode_max", DECODE_MAX_TOKENS)
        dm = self.decode_max_tokens
        if isinstance(dm, bool) or not isinstance(dm, int) or not 0 <= dm <= DECODE_MAX_TOKENS:
            raise ValueError(f"decode_max_tokens must be an int in [0, {DECODE_MAX_TOKENS}], got {dm!r}")
        object.__setattr__(self, "decode_tables", _check_shape_tables(self.decode_tables, "decode_tables"))
        for (h, f), table in self.decode_tables:
            if table and not (1 <= table[0][0] and table[-1][0] <= DECODE_MAX_TOKENS):
                raise ValueError(f"decode_tables ({h} x {f}): rows must start at 1 to {DECODE_MAX_TOKENS} tokens "
                                 f"(the small-batch kernels' range), got min_tokens {[m for m, _ in table]}")
        if not isinstance(self.decode_graphed, bool):
            raise TypeError(f"decode_graphed must be a bool, got {type(self.decode_graphed).__name__}")
        object.__setattr__(self, "capabilities", check_capabilities(self.capabilities))
        floor = self.eager_min_tokens
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"eager_min_tokens must be an int >= 0 (0: no floor for eager calls), got {floor!r}")
        work = self.eager_min_flops
        if isinstance(work, bool) or not isinstance(work, (int, float)) or not 0.0 <= work < math.inf:
            raise ValueError(f"eager_min_flops must be a finite number >= 0 (0: no floor for eager calls), "
                             f"got {work!r}")
        object.__setattr__(self, "eager_min_flops", float(work))
        if self.other_shapes not in OTHER_SHAPES_RULES:
            raise ValueError(f"other_shapes must be one of {OTHER_SHAPES_RULES}, got {self.other_shapes!r}")
        if self.other_shapes == "envelope" and self.shapes is not None:
            object.__setattr__(self, "_measured", tuple((s, t) for s, t in self.shape_tables if s in self.shapes))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def always_sparse(cls) -> DispatchPolicy:
        """Sparse for every token count, density and device (``max_density = 1`` from M = 0)."""
        return cls(table=((0, 1.0),), force=True)

    @classmethod
    def always_dense(cls) -> DispatchPolicy:
        """Dense for every call (an empty table)."""
        return cls(table=(), force=True)

    def without_eager_floor(self) -> DispatchPolicy:
        """This policy with no floor for eager calls (``eager_min_tokens`` and ``eager_min_flops`` 0): its tables
        decide eager and compiled calls as they decide graphed ones (and calls inside
        :func:`twell.nn.static_dispatch`).  For timing the tables with the GPU held (the benchmarks), or for eager
        code whose host keeps ahead of the GPU anyway."""
        return replace(self, eager_min_tokens=0, eager_min_flops=0.0)

    # ------------------------------------------------------------------ decision
    def envelope_shapes(self, shape: tuple[int, int] | None) -> tuple[tuple[int, int], ...]:
        """The measured shapes whose tables' envelope a layer of ``shape`` ``(hidden_size, intermediate_size)``
        follows (``other_shapes="envelope"``, a shape outside ``shapes``: :func:`bracketing_shapes`); empty if
        none."""
        return self._envelope_of_shape(shape)[0]

    def _envelope_of_shape(self, shape: tuple[int, int] | None) -> tuple[tuple[tuple[int, int], ...], DispatchTable]:
        """(:meth:`envelope_shapes`, the envelope table they give) for ``shape``; ((), ()) where no envelope applies."""
        if not self._measured or shape is None:
            return (), ()
        key = (int(shape[0]), int(shape[1]))
        hit = self._envelopes.get(key)
        if hit is None:
            bracket = () if key in self.shapes else bracketing_shapes(key, [s for s, _ in self._measured])  # type: ignore[operator]
            table = _bracket_envelope([t for s, t in self._measured if s in bracket],
                                      [t for _, t in self._measured]) if bracket else ()
            hit = self._envelopes[key] = (bracket, table)
        return hit

    def follows_envelope(self, shape: tuple[int, int] | None) -> bool:
        """True iff a layer of ``shape`` is dispatched by the envelope of measured shapes' tables."""
        return bool(self.envelope_shapes(shape))

    def table_for(self, shape: tuple[int, int] | None) -> DispatchTable:
        """The table of a layer shape ``(hidden_size, intermediate_size)``: its own in ``shape_tables``, else the
        envelope where :meth:`follows_envelope`, else ``table``."""
        if shape is not None:
            key = tuple(shape)
            for s, table in self.shape_tables:
                if s == key:
                    return table
            bracket, table = self._envelope_of_shape(shape)
            if bracket:
                return table
        return self.table

    def max_density(self, n_tokens: int, shape: tuple[int, int] | None = None) -> float | None:
        """The ``max_density`` of the row that applies to ``n_tokens`` (in the table of ``shape``), or None
        below the first row."""
        _check_tokens(n_tokens)
        # A scan of the (one to a few) rows rather than bisect: torch.compile traces it, where the C
        # bisect is a graph break (SparseGatedMLP's compiled inference path calls this).
        return _limit_at(self.table_for(shape), n_tokens)

    def on_measured_device(self, device_type: str, capability: tuple[int, int] | None = None) -> bool:
        """Whether the tables hold on this device: ``force``, or ``device_type`` in ``device_types`` and, on CUDA,
        ``capability`` in ``capabilities`` (None for either: not checked)."""
        if self.force:
            return True
        return device_type in self.device_types and capability_allowed(self.capabilities, device_type, capability)

    def use_sparse(
        self, n_tokens: int, density: float, *, device_type: str = "cuda", shape: tuple[int, int] | None = None,
        capability: tuple[int, int] | None = None, eager: bool = False,
    ) -> bool:
        """True iff the sparse path should run for ``n_tokens`` tokens at activation ``density`` (l0 / F).

        ``device_type`` is the ``torch.device.type`` of the inputs, ``capability`` the CUDA device's compute
        capability (:func:`twell.ops._runtime.cuda_capability`; None: not checked) and ``shape`` the layer's
        ``(hidden_size, intermediate_size)``; unless ``force`` is set, devices off :meth:`on_measured_device` and
        shapes outside ``shapes`` get the dense path, except shapes that :meth:`follows_envelope`.  ``eager``: the
        call is issued eagerly, so the eager floor applies (:meth:`eager_floor_tokens`, whatever ``force`` says).
        """
        _check_tokens(n_tokens)
        if self._below_eager_floor(n_tokens, eager, shape):
            return False
        if isinstance(density, bool) or not isinstance(density, (int, float)):
            raise TypeError(f"density must be a float, got {type(density).__name__}")
        if not 0.0 <= density <= 1.0:  # also refuses NaN
            raise ValueError(f"density must lie in [0, 1] (l0 / intermediate_size), got {density}")
        if not isinstance(device_type, str):
            raise TypeError(f"device_type must be a str such as 'cuda' or 'cpu', got {type(device_type).__name__}")
        if not self.on_measured_device(device_type, capability):
            return False
        if (not self.force and self.shapes is not None and (shape is None or tuple(shape) not in self.shapes)
                and not self.follows_envelope(shape)):
            return False
        if self.decode_graphed and self.decode_table_for(shape) is not None:
            # In a recorded step the shape's decode table decides its calls of up to DECODE_MAX_TOKENS tokens:
            # the small-batch kernels (use_decode) or dense.  The inference table was timed eagerly, at most shapes at
            # 1, 16 and 64 tokens, and until session 35 its one-token rows held for 2-15 tokens: the 1.5B model's
            # graphed batch-2 decode ran 0.799x of dense on them (policy decode-1,
            # model_decode_batch_kernels_session33.json); the decode table was timed in CUDA graphs at 1-64 tokens.
            if n_tokens <= self._decode_max:
                return False
        limit = self.max_density(n_tokens, shape)
        return limit is not None and density <= limit

    def eager_floor_tokens(self, shape: tuple[int, int] | None = None) -> int:
        """The fewest tokens an eager call of a layer of ``shape`` ``(hidden_size, intermediate_size)`` needs to
        take a sparse path: ``eager_min_tokens``, or more where ``eager_min_flops`` asks for more (a ``shape`` of
        None: ``eager_min_tokens`` alone); 0 when no floor applies."""
        floor = self.eager_min_tokens
        if self.eager_min_flops and shape is not None:
            work_per_token = dense_ffn_flops(1, shape)
            if work_per_token > 0:
                floor = max(floor, math.ceil(self.eager_min_flops / work_per_token))
        return floor

    def _below_eager_floor(self, n_tokens: int, eager: bool, shape: tuple[int, int] | None) -> bool:
        """True iff the eager floor sends this call dense (``eager``: see :meth:`use_sparse`)."""
        if not isinstance(eager, bool):
            raise TypeError(f"eager must be a bool, got {type(eager).__name__}")
        return eager and n_tokens < self.eager_floor_tokens(shape)

    def decode_table_for(self, shape: tuple[int, int] | None) -> DispatchTable | None:
        """The decode table of a layer shape ``(hidden_size, intermediate_size)`` in ``decode_tables``, or None."""
        if shape is not None:
            key = tuple(shape)
            for s, table in self.decode_tables:
                if s == key:
                    return table
        return None

    def use_decode(self, n_tokens: int, *, density: float = 1.0, device_type: str = "cuda",
                   shape: tuple[int, int] | None = None, capability: tuple[int, int] | None = None,
                   eager: bool = False) -> bool:
        """True iff a call of ``n_tokens`` tokens at activation ``density`` (l0 / F) takes the small-batch kernels:
        up to ``decode_max_tokens`` tokens whatever the density (in ``shapes``), else with ``decode_graphed`` where
        the layer shape's decode table says (``decode_tables``); on a device off :meth:`on_measured_device`, or for
        an ``eager`` call below :meth:`eager_floor_tokens`, never."""
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 <= density <= 1.0:
            raise ValueError(f"density must be a float in [0, 1] (l0 / intermediate_size), got {density!r}")
        if not 1 <= n_tokens <= self._decode_max:
            return False
        if self._below_eager_floor(n_tokens, eager, shape):
            return False
        if not self.on_measured_device(device_type, capability):
            return False
        if n_tokens <= self.decode_max_tokens:
            return self.force or self.shapes is None or (shape is not None and tuple(shape) in self.shapes)
        if not self.decode_graphed:
            return False
        limit = _limit_at(self.decode_table_for(shape) or (), n_tokens)
        return limit is not None and density <= limit


def envelope_table(tables: Iterable[DispatchTable]) -> DispatchTable:
    """The table that runs sparse only where every one of ``tables`` does: at each token count that starts a row in
    any of them, the lowest limit they give there (dense, i.e. no row, until every table has begun).

    What :class:`DispatchPolicy` applies to an unmeasured layer shape between measured ones
    (``other_shapes="envelope"``, with :func:`bracketing_shapes` and ``ENVELOPE_BRACKET_MIN_TOKENS``): a shape
    between measured ones should win wherever all of them do.
    """
    return _envelope_of([_check_table(t) for t in tables])


def bracketing_shapes(shape: tuple[int, int], measured: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The measured shapes nearest to ``shape`` ``(hidden_size, intermediate_size)`` that bracket it, sorted; empty
    unless some measured shape is no larger than it in both sizes and some is no smaller in both.

    Below: the measured shapes no larger in both sizes that no other such shape exceeds in both (the largest below
    it); above: those no smaller in both that no other such shape undercuts in both (the smallest above it).  Only
    the nearest count, so a small measured shape with a weak table (1024 x 3072, dense at 8192 tokens above 0.5 %
    in session 32) does not hold back a layer of 3072 x 8192, which 2048 x 8192, 4096 x 11008 and 3584 x 18944
    bracket."""
    h, f = shape
    shapes = set(measured)
    below = [s for s in shapes if s[0] <= h and s[1] <= f]
    above = [s for s in shapes if s[0] >= h and s[1] >= f]
    if not below or not above:
        return ()
    nearest_below = [s for s in below if not any(t != s and t[0] >= s[0] and t[1] >= s[1] for t in below)]
    nearest_above = [s for s in above if not any(t != s and t[0] <= s[0] and t[1] <= s[1] for t in above)]
    return tuple(sorted(set(nearest_below) | set(nearest_above)))


#: From this many tokens an unmeasured shape follows the envelope of the shapes that bracket it; below, that of every
#: measured shape.  Below 1024 tokens the H200 tables do not order by shape: 2048 x 5632 runs 9-511 tokens dense,
#: 2048 x 8192 runs 16 tokens sparse to 2 %, and 3072 x 8192, bracketed by 2048 x 8192, 4096 x 11008 and 3584 x 18944
#: (all three sparse at 16 tokens to 2 % or more in both of their runs), lost at 16 tokens in one of its two runs
#: (0.85x at 0.85 %, session 32).  From 1024 tokens the tables order by size: every shape of intermediate size 8192 or
#: more runs sparse at every density to ~10 %, the smaller ones less (2048 x 5632 to 1 % at 1024 tokens, 896 x 4864
#: from 2048 tokens, 1024 x 3072 with dips to 16,383).  scripts/envelope_holdout.py checks the rule on each measured
#: shape with two runs, left out in turn (bench_results/h200/session32_runs.md): no point it sends sparse lost.
ENVELOPE_BRACKET_MIN_TOKENS = 1024


def _bracket_envelope(bracket: list[DispatchTable], every: list[DispatchTable]) -> DispatchTable:
    """The envelope of ``every`` table below ``ENVELOPE_BRACKET_MIN_TOKENS`` tokens and of the ``bracket`` tables from
    there on (all checked)."""
    small, large = _envelope_of(every), _envelope_of(bracket)
    split = ENVELOPE_BRACKET_MIN_TOKENS
    at_split = _limit_at(large, split)
    rows = [r for r in small if r[0] < split]
    # ``small`` has rows only where every table has begun, the bracketing ones too; where they begin after the split,
    # both are empty there and the envelope starts with their first row
    if at_split is not None:
        rows.append((split, at_split))
    rows += [r for r in large if r[0] > split]
    merged: list[tuple[int, float]] = []
    for m, limit in rows:
        if not merged or merged[-1][1] != limit:
            merged.append((m, limit))
    return tuple(merged)


def _envelope_of(checked: list[DispatchTable]) -> DispatchTable:
    """:func:`envelope_table` of tables already checked."""
    rows: list[tuple[int, float]] = []
    for m in sorted({start for t in checked for start, _ in t}):
        limits = [_limit_at(t, m) for t in checked]
        if any(lim is None for lim in limits) and not rows:
            continue  # below some table's first row: dense, and no row yet
        limit = min(0.0 if lim is None else lim for lim in limits)
        if not rows or rows[-1][1] != limit:
            rows.append((m, limit))
    return tuple(rows)


def _limit_at(table: DispatchTable, n_tokens: int) -> float | None:
    """The ``max_density`` of the row of ``table`` that applies to ``n_tokens``, or None below its first row."""
    limit = None
    for start, max_density in table:
        if start > n_tokens:
            break
        limit = max_density
    return limit


def density_of(l0: float | None, n_units: int) -> float:
    """A layer's density l0 / F clamped to [0, 1] for a policy; an unknown l0 counts as 1 (fully dense),
    so that only an "always sparse" row says sparse before a layer's first call has measured it."""
    return 1.0 if l0 is None or n_units == 0 else min(1.0, max(0.0, l0 / n_units))


def _check_shape_tables(shape_tables: object, name: str = "shape_tables"
                        ) -> tuple[tuple[tuple[int, int], DispatchTable], ...]:
    """Normalise ``shape_tables`` (the field ``name``) to ``((hidden_size, intermediate_size), table)`` pairs; raise
    naming the bad entry."""
    if isinstance(shape_tables, (str, bytes, dict)) or not hasattr(shape_tables, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ((hidden_size, intermediate_size), table) pairs, got "
                        f"{type(shape_tables).__name__}")
    out: list[tuple[tuple[int, int], DispatchTable]] = []
    for i, entry in enumerate(shape_tables):  # type: ignore[union-attr]
        try:
            shape, table = entry
            h, f = shape
        except (TypeError, ValueError):
            raise ValueError(f"{name} entry {i} must be ((hidden_size, intermediate_size), table), "
                             f"got {entry!r}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, f)):
            raise TypeError(f"{name} entry {i}: the shape must be two positive ints, got {shape!r}")
        if any(s == (h, f) for s, _ in out):
            raise ValueError(f"{name} entry {i}: shape {(h, f)} appears twice")
        try:
            out.append(((h, f), _check_table(table)))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name} entry {i} ({h} x {f}): {exc}") from None
    return tuple(out)


def _check_tokens(n_tokens: object) -> None:
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int):
        raise TypeError(f"n_tokens must be an int, got {type(n_tokens).__name__}")
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")


#: Where a layer's graphed calls of 1-64 tokens take the small-batch kernels (``DispatchPolicy.decode_tables``, applied
#: with ``decode_graphed``): rows ``(min_tokens, max_density)`` by shape, from ``twell tune-decode`` on the H200 (bf16,
#: session 44, after the batch up kernel's two warps at 2-16 tokens: bench_results/h200/decode_<shape>_session44_a.json;
#: ``scripts/decode_tables_from_runs.py`` prints them; sessions 34-35's, from the slower kernel, were narrower at 2-32
#: tokens at most shapes).
#: A call between two measured token counts (1, 2, 4, ..., 64) takes the larger one's limit.  The synthetic activations
#: of a point come at random positions, so a point's density is what its tokens drew (at a 10 % target, 5.6-10 %);
#: a limit is the highest density up to which every point of its token count won by >= 1.05x.  2048 x 5632 (session 44):
#: one token 1.74-2.08x of dense at every density drawn, two tokens 1.28-1.48x, 64 tokens 1.16x at 0.26 % and 0.98x at
#: 2.03 %.
H200_BF16_DECODE_TABLES: tuple[tuple[tuple[int, int], DispatchTable], ...] = (
    ((2048, 5632), ((1, 0.0559304), (2, 0.0561080), (3, 0.0827415), (5, 0.0987660), (9, 0.0934615), (17, 0.0303234),
                    (33, 0.0103316))),
    ((4096, 14336), ((1, 0.1436245), (2, 0.0731376), (3, 0.0762417), (5, 0.0299247), (9, 0.0862863), (17, 0.0444554),
                     (33, 0.0025374))),
    ((4096, 11008), ((1, 0.1483467), (2, 0.0818496), (3, 0.0601836), (5, 0.0808276), (9, 0.0855855), (17, 0.0229549),
                     (33, 0.0024855))),
    ((2048, 8192), ((1, 0.0944825), (2, 0.0725709), (3, 0.0798646), (5, 0.1095887), (9, 0.1096650), (17, 0.0535431),
                    (33, 0.0025025))),
    ((1536, 8960), ((1, 0.0540179), (2, 0.0914063), (3, 0.0743304), (5, 0.0848215), (9, 0.0969727), (17, 0.0459857),
                    (33, 0.0022374))),
    ((896, 4864), ((1, 0.1032073), (2, 0.0987871), (3, 0.1317332), (5, 0.0856035), (9, 0.1102874), (17, 0.0500617),
                   (33, 0.0158017))),
    ((3072, 8192), ((1, 0.0415040), (2, 0.2324830), (3, 0.0707093), (5, 0.0822144), (9, 0.1103058), (17, 0.0465699),
                    (33, 0.0025521))),
    ((2304, 9216), ((1, 0.1049263), (2, 0.0970053), (3, 0.1135797), (5, 0.0773112), (9, 0.1224298), (17, 0.0294834),
                    (33, 0.0022109))),
    ((2560, 9728), ((1, 0.1263364), (2, 0.1119450), (3, 0.1063940), (5, 0.1204899), (9, 0.0968404), (17, 0.0303409),
                    (33, 0.0025651))),
    ((1024, 3072), ((1, 0.1578777), (2, 0.1199545), (3, 0.1018067), (5, 0.0737305), (9, 0.0988567), (17, 0.0550029),
                    (33, 0.0482687))),
    ((5120, 13824), ((1, 0.0790654), (2, 0.0659361), (3, 0.0454464), (5, 0.0310692), (9, 0.0902100), (17, 0.0313653),
                     (33, 0.0044556))),
    ((3584, 18944), ((1, 0.0879435), (2, 0.1522382), (3, 0.0839052), (5, 0.0531633), (9, 0.1118494), (17, 0.0098663),
                     (33, 0.0022691))),
)

#: The default policy's floor for eager calls, in dense FFN work (``DispatchPolicy.eager_min_flops``): 6 x 32768 x 1024
#: x 3072, derived by ``dispatch_tuning.derive_eager_min_flops`` from the eager points measured so far, pooled (a loss
#: where the eager call, or forward, ran slower than dense): ``twell tune-dispatch --eager`` at five shapes on an H100
#: 80GB HBM3 machine (session 43) and at 2048 x 5632 on the H200 machine (session 44), the points the tables send
#: sparse; and the 1.5B model's eager forward (2048 x 5632 layers) under the tables without a floor on both machines,
#: a point per token count where they send a layer sparse (bench_results/h100/dispatch_eager_*_session43.json,
#: bench_results/h200/dispatch_eager_*_session44.json, eager_floor_probe_calleagerfwd_session43.json,
#: eager_floor_probe_callverify_session44.json).  The largest losing work is the model's forward at 8192 tokens (0.977x
#: on the H100 machine, 0.784x on the H200's, though one eager layer there won 1.08x / 1.29x), the next measured one
#: 1024 x 3072 at 32,768 tokens (1.20x / 1.29x on the H100 machine).  In tokens: 8937 at 2048 x 5632, 1756 at 4096 x
#: 14336, 7490 at 1536 x 8960, 32,768 at 1024 x 3072.  Session 43's value, from the layer runs alone, was 6 x 8192 x
#: 2048 x 5632 (5.67e11).
EAGER_MIN_FLOPS = 618_475_290_624.0

#: Compute capabilities of the GPUs the shipped tables hold for: Hopper (sm_90: H100, H200, GH200).  Measured on an
#: H200; timed on an H100 80GB HBM3 in session 39 (bench_results/h100/): over three whole-grid runs at 2048x5632 and
#: 4096x14336 the tables lost at one point they send sparse (2048x5632, 512 tokens / 0.5 %, 0.93x), which two repeats
#: won (1.21x, 1.21x), and the large calls won as on the H200 (1.99x at 16,384 tokens / 0.5 %).
HOPPER = ((9, 0),)

#: The policy every :class:`~twell.nn.SparseGatedMLP` uses unless given another: the H200 bf16 tables of the twelve
#: measured layer shapes (:data:`H200_BF16_SHAPE_TABLES`, all from ``twell tune-dispatch``); a shape between them
#: follows the envelope of those that bracket it (:func:`bracketing_shapes`), any other runs dense, and so does
#: every layer on a GPU that is not a Hopper (``capabilities``).  Eager calls whose dense FFN would take fewer than
#: :data:`EAGER_MIN_FLOPS` floating-point operations run dense (``eager_min_flops``).
DEFAULT_POLICY = DispatchPolicy(shape_tables=H200_BF16_SHAPE_TABLES, other_shapes="envelope",
                                decode_tables=H200_BF16_DECODE_TABLES, capabilities=HOPPER,
                                eager_min_flops=EAGER_MIN_FLOPS)
