"""Per-layer FFN time of the 1.5B forward under several hot-set rules (``choose_hot_units``' frequency threshold
and cold-pairs bound), to see whether the rule tuned on the synthetic FFN suits the model's layers.

Why (session 23): in session 22's per-layer times (``bench_results/h200/forward_layer_times_dense_rows_session22.
log``) layers 5-14 took 7.0-7.7 ms sparse with 576-832 hot units against 6.0-6.5 ms for layers 16-27 with 128-256;
the forward sits at 1.348x of dense against the 1.35x goal.  A hot unit costs two GEMM columns for every token
(~1.8 us a unit at 131,072 tokens: its Wu row in the fused gate, its Wd row in the hot down GEMM), a cold one
~1.5-2 ns per firing token in the gather; the rule then (``HOT_MIN_FREQUENCY`` 1.3 %, a bound of 10 cold pairs)
was measured on the synthetic FFN at l0 14-112 (``hot_threshold_probe_session20.log``), not on these layers.  What
this grid found (the bound 13 on calls from 131,072 tokens, ``hot_cold_plan.default_max_cold_l0``) is the shipped
rule since; "shipped" below means the rule at the run's token count.  A rule with no hot unit runs the plain op
(block-union from 8192 tokens), whose speed here comes from the benchmark model's token overlap
(``scripts/forward_unions.py``).

Each rule ``FREQ:BOUND`` (``BOUND`` ``none``: no bound) is set on every sparse layer's hot/cold cache, which is
cleared so that the next call re-chooses the hot set from its 4096-token sample and builds the plan; each layer's
cache state (hot set, plan, dense-row fraction) is then kept per rule.  The timed forwards interleave the rules:
each of ``--reps`` rounds runs one forward per rule, restoring that rule's cache states first, so the GPU's drift
over the run (session 23's first, sequential grid: the shipped rule's 28 FFNs 188.374 ms first, 195.409 last,
``forward_hot_sets_session23.log``) falls on every rule alike.  Each layer's MLP call is timed with CUDA events;
medians over the rounds.  Printed per layer and rule: ms, hot units, cold pairs per token (from the rule's last
call's per-tile counts); then each rule's sum and the sum of each layer's best rule.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/forward_hot_sets.py [--rules 0.013:10 0.02:none ...]``;
``--device cpu --tiny`` (tiny preset, host clock) is the smoke test.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable

import torch
from forward_layer_times import (  # scripts/ (the script's own directory is on sys.path)
    add_model_args,
    cold_counts,
    hold_sparse,
    layer_times,
    prepare_forward,
)

from twell.bench.probe import probe_device, probe_parser
from twell.nn import SparseGatedMLP
from twell.ops.hot_cold_plan import HOT_MIN_FREQUENCY, check_max_cold_l0, default_max_cold_l0

#: (min_frequency, max_cold_l0); the bound may be the shipped function of (tokens, density) itself
Rule = tuple[float, float | None | Callable[[int, float], float]]


def shipped_rule(n_tokens: int) -> Rule:
    """The rule ``SparseGatedMLP`` applies on calls of ``n_tokens``: the bound depends on the call size, and at some
    sizes on each layer's density too, where the rule keeps the shipped function itself (named ``by-density``)."""
    fewest, most = default_max_cold_l0(n_tokens, 0.0), default_max_cold_l0(n_tokens, math.inf)
    return HOT_MIN_FREQUENCY, fewest if fewest == most else default_max_cold_l0

#: the default grid: wider cold bounds (the middle layers' best in the sequential grid) and fewer or no hot units
#: (1.0:none: no unit is hot, the plain TwELL path; the last layers' best there)
RULES: tuple[Rule, ...] = ((0.013, 13.0), (0.013, 16.0), (0.013, None), (0.02, 16.0), (0.035, None), (0.035, 16.0),
                           (1.0, None))


def parse_rule(text: str) -> Rule:
    """``FREQ:BOUND`` -> (min_frequency, max_cold_l0), ``BOUND`` ``none`` for no bound."""
    try:
        f, b = text.split(":")
        rule = float(f), None if b.lower() == "none" else float(b)
        check_max_cold_l0(rule[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rule is FREQ:BOUND (0 < FREQ <= 1, BOUND >= 0 or none), got {text!r}") \
            from None
    if not 0 < rule[0] <= 1:
        raise argparse.ArgumentTypeError(f"a rule's FREQ must be in (0, 1], got {text!r}")
    return rule


def rule_name(rule: Rule) -> str:
    bound = rule[1]
    return f"{rule[0]:.3f}:{'none' if bound is None else 'by-density' if callable(bound) else f'{bound:g}'}"


def hot_and_cold_l0(mlp: SparseGatedMLP) -> tuple[int, float]:
    """The hot count of the layer's plan and its last call's cold pairs per token (nan without kept counts)."""
    n_hot, cold = cold_counts(mlp)
    return n_hot, math.nan if cold is None else float(cold.float().sum(1).mean())


def set_rule(mlps: list[torch.nn.Module], rule: Rule) -> None:
    for mlp in mlps:
        cache = mlp._hot_cold
        cache.min_frequency, cache.max_cold_l0 = rule
        cache.clear()  # the next sparse call re-chooses the hot set under the new rule


def save_states(mlps: list[torch.nn.Module]) -> list[tuple]:
    """Each layer's hot/cold cache state (its hot sets, their plans, weights keys and dense-row fractions)."""
    return [m._hot_cold.snapshot() for m in mlps]


def restore_states(mlps: list[torch.nn.Module], rule: Rule, states: list[tuple]) -> None:
    """Put back the states :func:`save_states` kept under ``rule`` (set too, so that a refresh call in between
    re-chooses the same set: a set within ``KEEP_OVERLAP`` of the current one is ignored)."""
    for mlp, state in zip(mlps, states, strict=True):
        cache = mlp._hot_cold
        cache.min_frequency, cache.max_cold_l0 = rule
        cache.restore(state)


def main() -> None:
    ap = probe_parser(__doc__)
    add_model_args(ap)
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (one forward per rule each)")
    ap.add_argument("--rules", type=parse_rule, nargs="+", default=list(RULES),
                    help="FREQ:BOUND rules timed against the shipped one, interleaved")
    a = ap.parse_args()
    dev = probe_device(a.device)
    preset, batch, seq, reps = a.preset, a.batch, a.seq, a.reps
    if a.tiny:
        preset, batch, seq, reps = "tiny", 2, 16, 2
    bench = prepare_forward(preset, batch, seq, dev)
    dtype, ids = bench.dtype, bench.tokens
    shipped = shipped_rule(batch * seq)
    rules = [shipped, *(r for r in a.rules if r != shipped)]
    with torch.inference_mode():
        dense = layer_times(bench.model, bench.sets.use("dense"), ids, reps, dev) if not a.tiny else None
        mlps = bench.sets.use("sparse:default")
        if a.tiny:
            hold_sparse(mlps)
        states = []
        for rule in rules:
            set_rule(mlps, rule)
            for _ in range(2):  # the first call re-chooses the hot sets and builds the plans
                bench.model.model(input_ids=ids, use_cache=False)
            states.append(save_states(mlps))
        samples: list[list[list[float]]] = [[[] for _ in mlps] for _ in rules]  # [rule][layer] -> ms per round
        stats: list[list[tuple[int, float]]] = [[] for _ in rules]
        for _ in range(reps):
            for k, rule in enumerate(rules):
                restore_states(mlps, rule, states[k])
                for i, t in enumerate(layer_times(bench.model, mlps, ids, 1, dev)):
                    samples[k][i].append(t)
                stats[k] = [hot_and_cold_l0(m) for m in mlps]
        restore_states(mlps, shipped, states[0])
    results = [(rule, [statistics.median(s) for s in samples[k]], stats[k]) for k, rule in enumerate(rules)]
    print(f"{preset}, {batch} x {seq} tokens, {dtype}; per layer and rule (FREQ:BOUND): sparse ms / hot units / "
          f"cold pairs per token; medians of {reps} rounds that interleave the rules", flush=True)
    print("layer " + ("  dense  " if dense else "") + " ".join(f"{rule_name(r):>20}" for r, _, _ in results)
          + "  best", flush=True)
    best_sum = 0.0
    for i in range(len(results[0][1])):
        cells = [f"{t[i]:7.3f}/{h[i][0]:4d}/{h[i][1]:5.1f}" for _, t, h in results]
        j = min(range(len(results)), key=lambda k: results[k][1][i])
        best_sum += results[j][1][i]
        lead = f"{dense[i]:8.3f} " if dense else ""
        print(f"{i:5d} {lead}" + " ".join(f"{c:>20}" for c in cells) + f"  {rule_name(results[j][0])}", flush=True)
    sums = " ".join(f"{sum(t):20.3f}" for _, t, _ in results)
    print(f"  sum {f'{sum(dense):8.3f} ' if dense else ''}{sums}", flush=True)
    print(f"each layer's best rule: {best_sum:.3f} ms; the shipped rule {sum(results[0][1]):.3f} ms "
          f"({reps} interleaved rounds)", flush=True)


if __name__ == "__main__":
    main()
