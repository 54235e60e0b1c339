"""``twell bench model`` on the CPU with the tiny preset: sparsity calibration, every part end to end,
result files, per-part failure isolation.  Sizes are tiny (2 layers, hidden 64, a few hundred tokens);
float32 where dense and sparse outputs are compared exactly."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="twell.models needs the hf extra")

from twell.bench import model as bench_model  # noqa: E402
from twell.bench.model_energy import EnergyMeter  # noqa: E402
from twell.bench.model_measure import time_interleaved  # noqa: E402
from twell.bench.model_setup import prepare  # noqa: E402
from twell.bench.model_sparsity import BIAS_CHANNEL, SparsityTarget, measure_layers  # noqa: E402
from twell.bench.model_train import CHECK_MIN_TOKENS, TrainConfig, check_sequences  # noqa: E402
from twell.tolerances import (  # noqa: E402
    ABS_TOL_CALIBRATED_DEAD_FRACTION,
    FP32_ELEMENT_TOL,
    REL_TOL,
    REL_TOL_CALIBRATED_L0,
    REL_TOL_FP32_LOGIT_GAP,
)

CPU = torch.device("cpu")
#: Small everything: 4 x 64 forward tokens, 2-sequence training step, decode of 4 tokens.
SMALL = ["--preset", "tiny", "--batch", "4", "--seq", "64", "--train-batch", "2", "--warmup", "1", "--reps", "1",
         "--energy-seconds", "0", "--check-seqs", "1", "--train-warmup", "1", "--train-reps", "1",
         "--decode-batches", "1,2", "--prompt-len", "8", "--new-tokens", "4", "--decode-reps", "1"]


def _load(out: Path, stem: str = "model_tiny") -> dict:
    return json.loads((out / f"{stem}.json").read_text())


def test_calibration_reaches_target_l0_and_keeps_the_bias_channel() -> None:
    target = SparsityTarget(mean_l0=12.0)
    bench = prepare("tiny", device=CPU, dtype=torch.bfloat16, batch=8, seq=64, target=target, policies=("default",))
    # The calibration batch is the benchmark batch: measured l0 per layer is the target up to bf16
    # rounding of the thresholds and the round(p M) quantile granularity.
    layers = measure_layers(bench.model, bench.sets.use("dense"), bench.tokens)
    for cal, got in zip(bench.calibration, layers, strict=True):
        assert got["l0_mean"] == pytest.approx(cal["target_l0"], rel=REL_TOL_CALIBRATED_L0)
        assert got["dead_fraction"] == pytest.approx(target.dead_fraction, abs=ABS_TOL_CALIBRATED_DEAD_FRACTION)
        # the token overlap is recorded: a 64-token block's union holds at least a token's units
        assert got["union64"] >= got["l0_mean"] and 0 < got["union64_vs_independent"] <= 1.5
    mean = sum(r["l0_mean"] for r in layers) / len(layers)
    assert mean == pytest.approx(12.0, rel=REL_TOL_CALIBRATED_L0)
    # Early-middle layers denser: the targets of layer 0 (depth 1/4) exceed layer 1's (depth 3/4).
    assert bench.calibration[0]["target_l0"] > bench.calibration[1]["target_l0"]
    # The bias channel of the residual stream stays exactly constant through every layer.
    with torch.no_grad():
        hidden = bench.model.model(input_ids=bench.tokens[:2], output_hidden_states=True).hidden_states
    value = bench.model.config.initializer_range
    for h in hidden[:-1]:  # the last entry is after the final norm
        assert torch.all(h[..., BIAS_CHANNEL] == torch.tensor(value, dtype=h.dtype))


def test_all_parts_in_process_write_results(tmp_path: Path) -> None:
    rc = bench_model.main([*SMALL, "--dtype", "float32", "--isolation", "none", "--out", str(tmp_path)])
    data = _load(tmp_path)
    parts = data["meta"]["parts"]
    assert set(parts) == {"forward", "decode", "train"}
    assert all(p["status"] == "ok" for p in parts.values()), parts
    fwd = parts["forward"]["result"]["variants"]
    assert set(fwd) == {"dense", "sparse:default", "sparse:default+graphs", "sparse:always-sparse"}
    for name, v in fwd.items():
        assert v["tokens_per_ms"] > 0 and "error" not in v, name
    assert fwd["sparse:default+graphs"]["recorded_layers"] == []  # the CPU records nothing
    # float32, torch reference sparse path: the same function up to summation order.
    assert fwd["sparse:always-sparse"]["rel_l2_vs_dense"] < REL_TOL[torch.float32]
    assert fwd["sparse:always-sparse"]["ok"] is True
    assert fwd["sparse:always-sparse"]["sparse_layers"] == [0, 1]
    # per layer: the hot set and its dense-row budget where the layer chose one; the CPU's torch backend runs no
    # hot/cold split, so none here (the GPU runs record them: bench_results/h100/session46_runs.md)
    for name in ("sparse:default", "sparse:always-sparse"):
        assert fwd[name]["layer_hot_units"] == fwd[name]["layer_dense_rows"] == [None, None]
    dec = parts["decode"]["result"]["batches"]
    assert set(dec) == {"1", "2"}
    assert all(v["identical_fraction"] == 1.0 for b in dec.values() for v in b.values() if "speedup" in v)
    train = parts["train"]["result"]["variants"]
    assert set(train) == {"dense", "sparse:sparse-reference"}
    assert train["sparse:sparse-reference"]["tokens_per_ms"] > 0
    assert train["sparse:sparse-reference"]["ok"] is True
    assert len(train["sparse:sparse-reference"]["layer_l0"]) == 2
    setup = data["meta"]["setup"]
    assert setup["preset"] == "tiny" and len(setup["calibration"]) == 2
    assert "bias channel" in data["meta"]["sparsity_method"]
    with (tmp_path / "model_tiny.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["part"] for r in rows} == {"forward", "decode", "train"}
    assert rc == 0


def _run_small_fp32(tmp_path: Path, parts: str, *options: str) -> dict:
    """The tiny preset in float32, in this process: the parsed JSON's parts (each asserted ok)."""
    rc = bench_model.main([*SMALL, "--dtype", "float32", "--isolation", "none", "--parts", parts, *options,
                           "--out", str(tmp_path)])
    data = _load(tmp_path)
    assert rc == 0 and all(p["status"] == "ok" for p in data["meta"]["parts"].values()), data["meta"]["parts"]
    return data


def test_fused_rope_runs_in_every_variant(tmp_path: Path) -> None:
    from twell.nn import unfuse_rotary
    from twell.nn.rope import rotary_fused

    try:
        # 2 x 16 tokens instead of 4 x 64: the kernel runs one interpreted program per token, and at 256
        # tokens this test took 248 s of CI's ~47 min (bench_results/cpu_counts/session19_test_durations.log)
        data = _run_small_fp32(tmp_path, "forward,train", "--fused-rope", "--batch", "2", "--seq", "16")
        assert rotary_fused()
    finally:
        unfuse_rotary()  # the switch is process-wide: leave the other tests transformers' own function
    assert data["meta"]["setup"]["fused_rope"] is True and not rotary_fused()
    parts = data["meta"]["parts"]
    fwd = parts["forward"]["result"]["variants"]
    assert fwd["sparse:always-sparse"]["rel_l2_vs_dense"] < REL_TOL[torch.float32]
    assert fwd["sparse:always-sparse"]["ok"] is True
    assert parts["train"]["result"]["variants"]["sparse:sparse-reference"]["ok"] is True


def test_fused_norms_qkv_and_residual_run_in_every_variant(tmp_path: Path) -> None:
    data = _run_small_fp32(tmp_path, "forward,train", "--fused-norms", "--fused-qkv", "--fused-residual")
    assert data["meta"]["setup"]["fused_norms"] is True and data["meta"]["setup"]["fused_qkv"] is True
    assert data["meta"]["setup"]["fused_residual"] == 2  # both decoder layers
    parts = data["meta"]["parts"]
    fwd = parts["forward"]["result"]["variants"]
    assert fwd["sparse:always-sparse"]["rel_l2_vs_dense"] < REL_TOL[torch.float32]
    assert fwd["sparse:always-sparse"]["ok"] is True
    assert parts["train"]["result"]["variants"]["sparse:sparse-reference"]["ok"] is True


def test_compiled_forward_times_every_variant(tmp_path: Path) -> None:
    fwd = _run_small_fp32(tmp_path, "forward", "--forward-compile")["meta"]["parts"]["forward"]["result"]["variants"]
    for name, v in fwd.items():
        assert v["compiled_ms"] > 0 and len(v["compiled_ms_samples"]) == 1, name
        assert v["compiled_rel_l2_vs_eager"] < REL_TOL[torch.float32], name  # aot_eager on the CPU: the eager ops
    assert fwd["dense"]["compiled_speedup"] == 1.0


def test_reduce_overhead_forward_warms_each_sparse_set_up_and_calls_inside_static_dispatch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--forward-compile-mode reduce-overhead (inductor's CUDA graphs on the GPU; the mode is ignored by aot_eager on
    the CPU): a warm-up eager forward inside static_dispatch per sparse set, then every compiled call inside it."""
    import contextlib

    from twell.bench import model_forward
    from twell.nn import static_dispatch

    entered: list[str] = []

    @contextlib.contextmanager
    def counted(**kwargs: bool) -> object:
        entered.append("static_dispatch")
        with static_dispatch(**kwargs):
            yield

    monkeypatch.setattr(model_forward, "static_dispatch", counted)
    data = _run_small_fp32(tmp_path, "forward", "--forward-compile", "--forward-compile-mode", "reduce-overhead",
                           "--forward-policies", "default")
    result = data["meta"]["parts"]["forward"]["result"]
    assert result["compile_mode"] == "reduce-overhead"
    fwd = result["variants"]
    assert set(fwd) == {"dense", "sparse:default"}
    for name, v in fwd.items():
        assert v["compiled_ms"] > 0 and len(v["compiled_ms_samples"]) == 1, name
        assert v["compiled_rel_l2_vs_eager"] < REL_TOL[torch.float32], name
    # one warm-up (the sparse set), then per variant three untimed calls and one timed: 1 + 2 x (3 + 1)
    assert len(entered) == 9


def test_a_graphed_forward_variant_has_its_layers_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--forward-policies always-sparse+graphs``: the policy's layers with ``eager_graphs`` on (the default count),
    checked and timed beside the others; on the CPU nothing is recorded (no CUDA graphs: ``recorded_layers`` empty),
    and the policy sets no eager floor anyway."""
    from twell.bench import model_setup
    from twell.nn.call_graphs import DEFAULT_COUNTS

    seen: list[int] = []
    real = model_setup.MlpSets.add_converted

    def spy(self, name: str, policy: str, **kw: object) -> list:  # noqa: ANN001
        seen.append(int(kw.get("eager_graphs", 0)))
        return real(self, name, policy, **kw)

    monkeypatch.setattr(model_setup.MlpSets, "add_converted", spy)
    data = _run_small_fp32(tmp_path, "forward", "--forward-policies", "always-sparse,always-sparse+graphs")
    fwd = data["meta"]["parts"]["forward"]["result"]["variants"]
    assert set(fwd) == {"dense", "sparse:always-sparse", "sparse:always-sparse+graphs"}
    assert seen.count(DEFAULT_COUNTS) == 1 and seen[:2] == [0, DEFAULT_COUNTS]  # (then the decode part's "decode" set)
    graphed = fwd["sparse:always-sparse+graphs"]
    assert graphed["recorded_layers"] == [] and graphed["ms"] > 0
    assert graphed["rel_err_vs_fp32"] <= 10 * fwd["sparse:always-sparse"]["rel_err_vs_fp32"] + 1e-6


def test_mlp_sets_record_only_in_the_graphed_sets() -> None:
    """A set's name says whether its layers record eager calls (``+graphs``: the layers' default count) or not
    (``eager_graphs=0``, the model's own layers included), whatever the layer default."""
    from twell.bench.model_setup import PRESETS, MlpSets, build_model
    from twell.nn.call_graphs import DEFAULT_COUNTS

    model = build_model(PRESETS["tiny"], device=torch.device("cpu"), dtype=torch.float32, seed=0)
    assert {layer.mlp.eager_graphs for layer in model.model.layers} == {DEFAULT_COUNTS}
    sets = MlpSets(model, ("default", "default+graphs", "tables"))
    counts = {name: {m.eager_graphs for m in mods} for name, mods in sets.sets.items() if name != "dense"}
    assert counts == {"sparse:default": {0}, "sparse:default+graphs": {DEFAULT_COUNTS}, "sparse:tables": {0}}


def test_the_table_says_how_many_layers_a_graphed_set_recorded() -> None:
    from twell.bench.model_report import summary_table

    variants = {"dense": {"ms": 2.0, "speedup": 1.0, "rel_err_vs_fp32": 1e-2},
                "sparse:default+graphs": {"ms": 1.0, "speedup": 2.0, "rel_err_vs_fp32": 1e-2, "ok": True,
                                          "recorded_layers": [0, 1, 2]}}
    parts = {"forward": {"status": "ok", "result": {"batch": 2, "tokens": 64, "variants": variants}}}
    table = summary_table(parts, "tiny", "cpu")
    assert "| forward | sparse:default+graphs | 2 |" in table and "err 1.0e-02 vs fp32 ok, 3 layers recorded |" in table
    assert "| forward | dense | 2 |" in table and "err 1.0e-02 vs fp32 |" in table


def test_set_policy_names_the_accepted_sets() -> None:
    from twell.bench.model_setup import set_policy

    assert set_policy("default+graphs") == "default" and set_policy("tables") == "tables"
    with pytest.raises(ValueError, match="optionally with '\\+graphs'"):
        set_policy("graphs")


def test_reduce_overhead_forward_with_cached_weights_prepares_each_sparse_layer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--forward-cached-weights (on by default in reduce-overhead mode): after each sparse set's warm-up its layers
    prepare their weight copies, and every compiled call runs inside static_dispatch(cached_weights=True)."""
    import contextlib

    from twell.bench import model_forward
    from twell.nn import SparseGatedMLP, static_dispatch

    flags: list[bool] = []
    prepared: list[int] = []

    @contextlib.contextmanager
    def recorded(*, cached_weights: bool = False) -> object:
        flags.append(cached_weights)
        with static_dispatch(cached_weights=cached_weights):
            yield

    real = SparseGatedMLP.prepare_static_weights

    def counting(self: SparseGatedMLP) -> bool:
        prepared.append(id(self))
        return real(self)

    monkeypatch.setattr(model_forward, "static_dispatch", recorded)
    monkeypatch.setattr(SparseGatedMLP, "prepare_static_weights", counting)
    data = _run_small_fp32(tmp_path, "forward", "--forward-compile", "--forward-compile-mode", "reduce-overhead",
                           "--forward-policies", "default")
    result = data["meta"]["parts"]["forward"]["result"]
    assert result["cached_weights"] is True
    # the CPU's torch backend runs no split: each layer prepares its Wd^T only and says so
    assert result["variants"]["sparse:default"]["cached_weights_ready"] == [False, False]
    assert len(prepared) == 2 == len(set(prepared))
    # the warm-up call without the flag, then 2 variants x (3 untimed + 1 timed) calls with it
    assert flags == [False] + [True] * 8
    for v in result["variants"].values():
        assert v["compiled_rel_l2_vs_eager"] < REL_TOL[torch.float32]


def test_no_forward_cached_weights_records_without_the_copies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-forward-cached-weights: reduce-overhead calls run inside static_dispatch(cached_weights=False) and no layer
    prepares its copies (the traced call then builds the split's weights itself, as before session 47)."""
    from twell.nn import SparseGatedMLP

    def refuse(self: SparseGatedMLP) -> bool:
        raise AssertionError("prepare_static_weights called with --no-forward-cached-weights")

    monkeypatch.setattr(SparseGatedMLP, "prepare_static_weights", refuse)
    data = _run_small_fp32(tmp_path, "forward", "--forward-compile", "--forward-compile-mode", "reduce-overhead",
                           "--no-forward-cached-weights", "--forward-policies", "default")
    result = data["meta"]["parts"]["forward"]["result"]
    assert result["cached_weights"] is False
    assert "cached_weights_ready" not in result["variants"]["sparse:default"]


def test_cached_weights_needs_recorded_calls() -> None:
    from twell.bench.model_forward import ForwardConfig

    with pytest.raises(ValueError, match="cached_weights applies to recorded calls"):
        ForwardConfig(compile=True, cached_weights=True)
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--parts", "forward", "--forward-compile", "--forward-cached-weights"])


def test_a_bad_compile_mode_is_refused_by_name() -> None:
    from twell.bench.model_forward import ForwardConfig

    with pytest.raises(ValueError, match="compile_mode must be one of default, reduce-overhead; got 'fast'"):
        ForwardConfig(compile_mode="fast")


def test_compiled_training_step_runs_both_variants(tmp_path: Path) -> None:
    train = _run_small_fp32(tmp_path, "train", "--train-compile")["meta"]["parts"]["train"]["result"]["variants"]
    for name, v in train.items():
        assert v["compiled"] is True and v["tokens_per_ms"] > 0 and "error" not in v, (name, v.get("error"))
    assert train["sparse:sparse-reference"]["ok"] is True


def test_failing_part_is_recorded_and_the_rest_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(bench_model, "run_forward", broken)
    rc = bench_model.main([*SMALL, "--parts", "forward,decode", "--decode-batches", "1", "--isolation", "none",
                           "--out", str(tmp_path)])
    parts = _load(tmp_path)["meta"]["parts"]
    assert parts["forward"]["status"] == "error"
    assert "simulated kernel failure" in parts["forward"]["error"]
    assert parts["decode"]["status"] == "ok"
    assert rc == 1


def test_part_in_child_process(tmp_path: Path) -> None:
    args = ["--preset", "tiny", "--batch", "2", "--seq", "32", "--warmup", "0", "--reps", "1", "--energy-seconds",
            "0", "--check-seqs", "0", "--forward-policies", "always-sparse", "--parts", "forward",
            "--isolation", "process", "--out", str(tmp_path)]
    assert bench_model.main(args) == 0
    part = _load(tmp_path)["meta"]["parts"]["forward"]
    assert part["status"] == "ok"
    assert part["result"]["variants"]["sparse:always-sparse"]["ms"] > 0
    assert (tmp_path / "model_tiny_parts" / "forward.json").exists()


def test_time_interleaved_keeps_going_after_a_failing_variant() -> None:
    calls: list[str] = []

    def ok() -> int:
        calls.append("ok")
        return 1

    def bad() -> None:
        calls.append("bad")
        raise ValueError("boom")

    t = time_interleaved({"bad": bad, "ok": ok}, device=CPU, warmup=1, reps=3)
    assert calls == ["bad", "ok", "ok", "ok", "ok"]
    assert "boom" in t.errors["bad"] and len(t.samples["ok"]) == 3 and t.last["ok"] == 1
    assert t.median_ms("bad") is None


def test_compiled_decode_variants_are_timed_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    from twell.bench import model_decode, model_measure

    calls: list[str] = []
    resets: list[int] = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(len(calls)))

    def variant(name: str):  # noqa: ANN202 - a test helper
        def run() -> str:
            calls.append(name)
            if name == "bad":
                raise RuntimeError("no graph")
            return name
        return run

    t = model_measure.time_compiled_variants({n: variant(n) for n in ("dense", "bad", "sparse")}, CPU, reps=2)
    # each variant: a reset, one untimed warm-up, then its reps, before the next variant starts
    assert calls == ["dense"] * 3 + ["bad"] + ["sparse"] * 3 and resets == [0, 3, 4]
    assert len(t.samples["dense"]) == 2 and len(t.samples["sparse"]) == 2 and t.last["sparse"] == "sparse"
    assert "no graph" in t.errors["bad"] and t.median_ms("bad") is None
    cfg = model_decode.DecodeConfig(static_cache=True)
    assert model_decode._compiled_step(cfg, torch.device("cuda")) and not model_decode._compiled_step(cfg, CPU)


def test_graphed_decode_loop_matches_generate(tmp_path: Path) -> None:
    """--decode-loop graphed: every variant through twell.generation.GreedyDecoder; its tokens are
    generate's (the same dense and sparse outputs as the generate loop on the same prompts)."""
    runs = {}
    for loop in ("generate", "graphed"):
        out = tmp_path / loop
        rc = bench_model.main([*SMALL, "--parts", "decode", "--decode-policies", "decode-1,always-sparse",
                               "--decode-loop", loop, "--isolation", "none", "--out", str(out)])
        assert rc == 0
        runs[loop] = _load(out)["meta"]["parts"]["decode"]["result"]
    graphed = runs["graphed"]
    assert graphed["loop"] == "graphed" and graphed["static_cache"] is False
    for b, entries in graphed["batches"].items():
        for name, v in entries.items():
            assert "error" not in v, (name, v.get("error"))
            assert v["tokens_per_s"] > 0 and v["identical_fraction"] == 1.0, (b, name)
            assert runs["generate"]["batches"][b][name]["identical_fraction"] == 1.0
            if name != "dense":  # the recorded step's choices, under the decoder's policies, with the estimates
                paths = v["decode_step_paths"]
                assert len(paths) == len(v["l0_estimates"]) > 0
                assert v["sparse_layers_decode_step"] == sum(p != "dense" for p in paths)
        for loop in ("generate", "graphed"):  # each loop's diagnostic sees the tokens that loop could pick
            entries = runs[loop]["batches"][b]
            assert entries["dense"]["dense_forced_mismatches"] == 0 and entries["dense"]["dense_top2_gap"]["min"] > 0
            assert all(v["divergences"] == [] for name, v in entries.items() if name != "dense"), (loop, b)
    compiled = tmp_path / "compiled"
    rc = bench_model.main([*SMALL, "--parts", "decode", "--decode-policies", "always-sparse", "--decode-batches", "1",
                           "--decode-loop", "graphed", "--decode-compile", "--isolation", "none",
                           "--out", str(compiled)])
    assert rc == 0
    result = _load(compiled)["meta"]["parts"]["decode"]["result"]
    assert result["compile"] is True
    for name, v in result["batches"]["1"].items():
        assert "error" not in v and v["identical_fraction"] == 1.0, (name, v)
    with pytest.raises(ValueError, match="loop must be one of"):
        from twell.bench import model_decode

        model_decode.run_decode(None, model_decode.DecodeConfig(loop="fast"), print, print)  # type: ignore[arg-type]


def test_energy_meter_reports_why_it_is_unavailable() -> None:
    meter = EnergyMeter(CPU)
    assert meter.method is None and "cpu" in meter.reason
    with pytest.raises(RuntimeError, match="energy unavailable"):
        meter.measure(lambda: None, min_seconds=0.1)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--parts", "forward,nonsense"])
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--batch", "2", "--train-batch", "4", "--parts", "train"])
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--forward-policies", "fastest"])
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--forward-policies", "fastest+graphs"])
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--parts", "decode", "--decode-compile"])
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--parts", "forward", "--forward-compile-mode", "reduce-overhead"])
    with pytest.raises(SystemExit):
        bench_model.main(["--preset", "tiny", "--parts", "forward", "--forward-compile", "--forward-compile-mode",
                          "max-autotune"])


def test_divergence_diagnostic_reports_first_position_and_dense_logit_gap() -> None:
    """A fake variant output that leaves the dense tokens at known generated positions: each differing
    sequence is reported at its first divergent position, with the gap, top-2 gap and spread of the dense
    logits there as an independent dense forward over prompt + p tokens gives them."""
    from twell.bench import model_decode

    prompt_len, new = 8, 6
    bench = prepare("tiny", device=CPU, dtype=torch.float32, batch=4, seq=64, target=SparsityTarget(mean_l0=8.0),
                    policies=("always-sparse",))
    vocab = bench.spec.vocab_size
    with torch.no_grad():
        dense_out = model_decode._generate(bench, "dense", bench.tokens[:3, :prompt_len], new)
    fake = dense_out.clone()
    flips = {1: 3, 2: 0}  # sequence -> first divergent generated position; sequence 0 stays identical
    for i, p in flips.items():
        fake[i, prompt_len + p:] = (dense_out[i, prompt_len + p:] + 1) % vocab  # differs from p on
    # generate (min_new_tokens == max_new_tokens) never picks the end-of-sequence token: Llama's eos 2
    suppressed = model_decode._suppressed_tokens(bench, "generate")
    assert suppressed == (2,) and model_decode._suppressed_tokens(bench, "graphed") == ()
    bench.sets.use("sparse:always-sparse")  # the diagnostic must switch to the dense layers itself
    fields = model_decode._divergence_diagnostic(
        bench, dense_out, {"dense": dense_out, "sparse:fake": fake, "sparse:same": dense_out.clone()}, prompt_len,
        suppressed)
    assert all(layer.mlp is m for layer, m in zip(bench.model.model.layers, bench.sets.sets["dense"], strict=True))
    assert fields["sparse:same"] == {"divergences": [], "max_divergence_gap": None}

    divergences = fields["sparse:fake"]["divergences"]
    assert [(d["sequence"], d["position"]) for d in divergences] == sorted(flips.items())
    all_gaps = []
    with torch.no_grad():
        for i in range(3):
            for p in range(new):
                logits = bench.model(input_ids=dense_out[i:i + 1, :prompt_len + p]).logits[0, -1].float()
                logits[list(suppressed)] = float("-inf")  # as generate's MinNewTokensLengthLogitsProcessor
                top = logits.topk(2).values
                all_gaps.append(float(top[0] - top[1]))
                if flips.get(i) != p:
                    continue
                d = divergences[0 if i == 1 else 1]
                dense_token, token = int(dense_out[i, prompt_len + p]), int(fake[i, prompt_len + p])
                assert (d["dense_token"], d["token"]) == (dense_token, token)
                assert int(logits.argmax()) == dense_token  # greedy: the dense token is the top-1 logit
                assert d["gap"] == pytest.approx(float(logits[dense_token] - logits[token]), rel=REL_TOL_FP32_LOGIT_GAP,
                                                 abs=FP32_ELEMENT_TOL)
                assert d["gap"] >= d["top2_gap"] - FP32_ELEMENT_TOL and d["top2_gap"] > 0
                assert d["top2_gap"] == pytest.approx(all_gaps[-1], rel=REL_TOL_FP32_LOGIT_GAP, abs=FP32_ELEMENT_TOL)
                kept = torch.ones_like(logits, dtype=torch.bool)
                kept[list(suppressed)] = False
                assert d["logit_std"] == pytest.approx(float(logits[kept].std()), rel=REL_TOL_FP32_LOGIT_GAP)
                assert 0 < d["top2_gap_quantile"] <= 1
    assert fields["sparse:fake"]["max_divergence_gap"] == max(d["gap"] for d in divergences)
    dense = fields["dense"]
    assert dense["dense_forced_mismatches"] == 0  # float32 on the CPU: prefill and KV-cache steps agree
    reference = torch.tensor(all_gaps)
    assert dense["dense_top2_gap"]["min"] == pytest.approx(float(reference.min()), rel=REL_TOL_FP32_LOGIT_GAP,
                                                          abs=FP32_ELEMENT_TOL)
    assert dense["dense_top2_gap"]["median"] == pytest.approx(float(reference.quantile(0.5)),
                                                             rel=REL_TOL_FP32_LOGIT_GAP, abs=FP32_ELEMENT_TOL)
    assert dense["dense_top2_gap"]["min"] <= dense["dense_top2_gap"]["p01"] <= dense["dense_top2_gap"]["median"]
    json.dumps(fields)  # plain Python values only


def test_gap_summary_is_min_first_percentile_and_median() -> None:
    from twell.bench import model_decode

    summary = model_decode._gap_summary(torch.arange(101, dtype=torch.bfloat16).flip(0).reshape(1, 101))
    assert summary == {"min": 0.0, "p01": 1.0, "median": 50.0}


def test_decode_part_reports_a_divergence_in_json_csv_and_table(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant whose generation is made to leave the dense tokens at its last token (sequence 0 only):
    the decode part records that divergence and the table's check column shows it."""
    from twell.bench import model_decode
    from twell.bench.model_report import summary_table

    generate = model_decode._generate

    def flip_last_token(bench, name, prompt, new_tokens, static_cache=False):  # noqa: ANN001, ANN202 - a test stub
        out = generate(bench, name, prompt, new_tokens, static_cache)
        if name == "sparse:always-sparse":
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % bench.spec.vocab_size
        return out

    monkeypatch.setattr(model_decode, "_generate", flip_last_token)
    data = _run_small_fp32(tmp_path, "decode", "--decode-policies", "default,always-sparse")
    parts = data["meta"]["parts"]
    batches = parts["decode"]["result"]["batches"]
    for b, identical in (("1", 0.0), ("2", 0.5)):
        entries = batches[b]
        margins = entries["dense"]["dense_top2_gap"]
        assert 0 < margins["min"] <= margins["p01"] <= margins["median"], (b, margins)
        assert entries["dense"]["dense_forced_mismatches"] == 0
        untouched = entries["sparse:default"]
        assert untouched["divergences"] == [] and untouched["max_divergence_gap"] is None
        flipped = entries["sparse:always-sparse"]
        assert flipped["identical_fraction"] == identical
        (d,) = flipped["divergences"]
        assert (d["sequence"], d["position"]) == (0, 3)  # --new-tokens 4: the last generated token
        assert d["gap"] >= d["top2_gap"] >= margins["min"] and flipped["max_divergence_gap"] == d["gap"]
        assert not any("divergence_error" in v for v in entries.values())
    with (tmp_path / "model_tiny.csv").open() as fh:
        rows = {(r["variant"], r["batch"]): r for r in csv.DictReader(fh)}
    gap = batches["2"]["sparse:always-sparse"]["max_divergence_gap"]
    assert float(rows[("sparse:always-sparse", "2")]["max_divergence_gap"]) == pytest.approx(gap)
    assert rows[("sparse:always-sparse", "2")]["divergences"] == "1"
    assert rows[("sparse:default", "2")]["divergences"] == "0"
    p01 = batches["2"]["dense"]["dense_top2_gap"]["p01"]
    assert float(rows[("dense", "2")]["dense_top2_gap_p01"]) == pytest.approx(p01)
    table = summary_table(parts, "tiny", "cpu")
    assert f"| 50 % identical; 1 divergence, gap {gap:.2g} (dense top-2 gap p01 {p01:.2g}) |" in table
    assert "| 100 % identical; top-2 gap min " in table


def test_failing_divergence_diagnostic_is_recorded_and_the_part_goes_on(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from twell.bench import model_decode
    from twell.bench.model_report import summary_table

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated logits failure")

    monkeypatch.setattr(model_decode, "_forced_dense_logits", broken)
    data = _run_small_fp32(tmp_path, "decode", "--decode-batches", "1")
    entries = data["meta"]["parts"]["decode"]["result"]["batches"]["1"]
    for name, v in entries.items():
        assert "simulated logits failure" in v["divergence_error"], name
        assert "error" not in v and v["identical_fraction"] == 1.0 and v["tokens_per_s"] > 0, name
        assert "divergences" not in v and "dense_top2_gap" not in v, name
    table = summary_table(data["meta"]["parts"], "tiny", "cpu")
    assert table.count("100 % identical; divergence check failed: RuntimeError: simulated logits") == len(entries)


def test_train_table_says_compiled_and_spilled_tokens() -> None:
    """A training variant's check column names a compiled step and the tokens the hot/cold op recomputed densely in
    the last timed step (session 55's first compiled step ran 0.068x of dense with spills that only the JSON held)."""
    from twell.bench.model_report import summary_table
    from twell.bench.model_train import train_rows

    result = {"batch": 8, "tokens": 16384, "variants": {
        "dense": {"ms": 300.0, "tokens_per_ms": 54.6, "speedup": 1.0, "compiled": True},
        "sparse:hot-cold": {"ms": 4350.0, "tokens_per_ms": 3.8, "speedup": 0.069, "compiled": True,
                            "layer_spilled_tokens_last_step": [0, 3749, 5646, 0]},
        "sparse:eager": {"ms": 228.0, "tokens_per_ms": 71.9, "speedup": 1.32,
                         "layer_spilled_tokens_last_step": [0, 0, 0, 0]},
    }}
    rows = {r["variant"]: r for r in train_rows(result)}
    assert rows["sparse:hot-cold"]["spilled_tokens_last_step"] == 9395 and rows["sparse:hot-cold"]["compiled"]
    assert rows["sparse:eager"]["spilled_tokens_last_step"] == 0 and not rows["sparse:eager"]["compiled"]
    assert rows["dense"]["spilled_tokens_last_step"] is None
    table = summary_table({"train": {"status": "ok", "result": result}}, "tiny", "cpu")
    line = {ln.split("|")[2].strip(): ln for ln in table.splitlines() if ln.startswith("| train")}
    assert line["sparse:hot-cold"].endswith("| 9395 tokens recomputed densely (spilled) in the last step, compiled |")
    assert line["dense"].endswith("| compiled |") and line["sparse:eager"].endswith("|  |")


@pytest.mark.parametrize(("check_seqs", "batch", "seq", "want"), [
    (None, 8, 64, 4),      # 256 tokens of 64-token sequences
    (None, 8, 100, 3),     # rounded up to whole sequences
    (None, 8, 2048, 1),    # the 1.5B preset: one sequence covers it
    (None, 2, 32, 2),      # never more than the batch
    (3, 8, 64, 3),         # an explicit count stands
    (12, 8, 64, 8),        # at most the batch
    (0, 8, 64, 1),         # 0 skips the check (the slice is unused then)
])
def test_train_check_covers_the_minimum_tokens_in_whole_sequences(check_seqs, batch, seq, want):
    assert CHECK_MIN_TOKENS == 256
    assert check_sequences(TrainConfig(batch=batch, check_seqs=check_seqs), seq) == want


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_train_check_seqs_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError, match="check_seqs must be None"):
        TrainConfig(check_seqs=bad)
