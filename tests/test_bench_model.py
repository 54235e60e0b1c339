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
        assert got["l0_mean"] == pytest.approx(cal["target_l0"], rel=0.1)
        assert got["dead_fraction"] == pytest.approx(target.dead_fraction, abs=0.02)
    mean = sum(r["l0_mean"] for r in layers) / len(layers)
    assert mean == pytest.approx(12.0, rel=0.1)
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
    assert set(fwd) == {"dense", "sparse:default", "sparse:always-sparse"}
    for name, v in fwd.items():
        assert v["tokens_per_ms"] > 0 and "error" not in v, name
    # float32, torch reference sparse path: the same function up to summation order.
    assert fwd["sparse:always-sparse"]["rel_l2_vs_dense"] < 1e-5
    assert fwd["sparse:always-sparse"]["ok"] is True
    assert fwd["sparse:always-sparse"]["sparse_layers"] == [0, 1]
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
        data = _run_small_fp32(tmp_path, "forward,train", "--fused-rope")
        assert rotary_fused()
    finally:
        unfuse_rotary()  # the switch is process-wide: leave the other tests transformers' own function
    assert data["meta"]["setup"]["fused_rope"] is True and not rotary_fused()
    parts = data["meta"]["parts"]
    fwd = parts["forward"]["result"]["variants"]
    assert fwd["sparse:always-sparse"]["rel_l2_vs_dense"] < 1e-5 and fwd["sparse:always-sparse"]["ok"] is True
    assert parts["train"]["result"]["variants"]["sparse:sparse-reference"]["ok"] is True


def test_fused_norms_run_in_every_variant(tmp_path: Path) -> None:
    data = _run_small_fp32(tmp_path, "forward,train", "--fused-norms")
    assert data["meta"]["setup"]["fused_norms"] is True
    parts = data["meta"]["parts"]
    fwd = parts["forward"]["result"]["variants"]
    assert fwd["sparse:always-sparse"]["rel_l2_vs_dense"] < 1e-5 and fwd["sparse:always-sparse"]["ok"] is True
    assert parts["train"]["result"]["variants"]["sparse:sparse-reference"]["ok"] is True


def test_compiled_forward_times_every_variant(tmp_path: Path) -> None:
    fwd = _run_small_fp32(tmp_path, "forward", "--forward-compile")["meta"]["parts"]["forward"]["result"]["variants"]
    for name, v in fwd.items():
        assert v["compiled_ms"] > 0 and len(v["compiled_ms_samples"]) == 1, name
        assert v["compiled_rel_l2_vs_eager"] < 1e-5, name  # aot_eager on the CPU: the eager ops
    assert fwd["dense"]["compiled_speedup"] == 1.0


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
        bench_model.main(["--preset", "tiny", "--parts", "decode", "--decode-compile"])
