"""``twell tune-dispatch`` end to end on a tiny CPU layer, and ``--from`` on a recorded run."""

from __future__ import annotations

import json

import pytest
import torch

from twell import cli
from twell.nn import DispatchPolicy, load_policy
from twell.tolerances import REL_TOL


def test_tuning_a_tiny_layer_writes_checked_points_and_a_loadable_policy(tmp_path, capsys):
    code = cli.main(["tune-dispatch", "--shape", "64x256", "--ms", "8", "40", "--densities", "5", "--dtype", "float32",
                     "--rep-ms", "1", "--out", str(tmp_path)])
    assert code == 0
    run = json.loads((tmp_path / "dispatch_64x256.json").read_text())
    assert run["meta"]["shape"] == [64, 256] and run["meta"]["device_type"] == "cpu"
    assert [r["m"] for r in run["rows"]] == [8, 40]
    for r in run["rows"]:
        assert r["ok"] and r["rel_err"] < REL_TOL[torch.float32] and r["sparse_path"] == "sparse"
        # the dense module's own error, the fallback bar (tolerances.py)
        assert 0 <= r["dense_rel_err"] < REL_TOL[torch.float32]
        assert r["dense_ms"] > 0 and r["sparse_ms"] > 0
        assert r["speedup"] == pytest.approx(r["dense_ms"] / r["sparse_ms"])
        assert r["density"] == pytest.approx(r["l0"] / 256) and r["l0"] > 0
        assert min(r["dense_rounds_ms"]) <= r["dense_ms"] <= max(r["dense_rounds_ms"])
    policy = load_policy(tmp_path / "dispatch_64x256_policy.json")
    assert policy.shapes == ((64, 256),) and policy.device_types == ("cpu",) and not policy.force
    out = capsys.readouterr().out
    assert "dispatch for 64x256 on cpu" in out


def test_from_rederives_a_recorded_run_with_another_margin(tmp_path, capsys):
    rows = [{"d": 2048, "f": 5632, "m": m, "density": dens, "dense_ms": 1.0, "sparse_ms": 1.0 / s, "ok": True,
             "sparse_path": "sparse"} for m, dens, s in ((4096, 0.005, 1.03), (16384, 0.005, 1.5), (16384, 0.01, 1.3),
                                                         (16384, 0.05, 1.04))]
    rows.append({"d": 2048, "f": 5632, "m": 131072, "density_pct": 0.5, "error": "out of memory"})
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"meta": {"shape": [2048, 5632], "device_type": "cuda", "device": "NVIDIA H200",
                                        "dtype": "bfloat16"}, "rows": rows}))
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "a"]) == 0
    assert load_policy(tmp_path / "a_policy.json") == DispatchPolicy(table=((16384, 0.01),), shapes=((2048, 5632),))
    assert "16384 <= M" not in capsys.readouterr().out  # one row: "M >= 16384"
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "b",
                     "--min-speedup", "1.0"]) == 0
    assert load_policy(tmp_path / "b_policy.json").table == ((4096, 0.005), (16384, 0.05))
    out = capsys.readouterr().out
    assert "4096 <= M < 16384: sparse when density <= 0.5 %" in out and "M >= 16384: sparse when density <= 5 %" in out


def _run_file(path, shape, points, device_type="cuda", commit="abc1234", capability=None):
    d, f = shape
    rows = [{"d": d, "f": f, "m": m, "density": dens, "dense_ms": 1.0, "sparse_ms": 1.0 / s, "ok": True,
             "sparse_path": "sparse"} for m, dens, s in points]
    meta = {"shape": [d, f], "device_type": device_type, "device": "NVIDIA H200", "dtype": "bfloat16", "commit": commit}
    if capability is not None:
        meta["capability"] = capability
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    return path


def test_from_holds_the_policy_to_the_runs_compute_capability(tmp_path, capsys):
    """A run that names its GPU's capability (environment(): "9.0") limits the policy to it, also merged with an older
    run that names none; runs of two capabilities are refused."""
    old = _run_file(tmp_path / "old.json", (2048, 5632), ((512, 0.005, 1.2),))
    new = _run_file(tmp_path / "new.json", (2048, 5632), ((512, 0.005, 1.3),), capability="9.0")
    assert cli.main(["tune-dispatch", "--from", str(old), str(new), "--out", str(tmp_path), "--stem", "m"]) == 0
    policy = load_policy(tmp_path / "m_policy.json")
    assert policy.capabilities == ((9, 0),) and policy.use_sparse(512, 0.005, shape=(2048, 5632), capability=(9, 0))
    assert not policy.use_sparse(512, 0.005, shape=(2048, 5632), capability=(8, 0))
    assert cli.main(["tune-dispatch", "--from", str(old), "--out", str(tmp_path), "--stem", "o"]) == 0
    assert load_policy(tmp_path / "o_policy.json").capabilities is None
    a100 = _run_file(tmp_path / "a100.json", (2048, 5632), ((512, 0.005, 1.2),), capability="8.0")
    with pytest.raises(SystemExit):
        cli.main(["tune-dispatch", "--from", str(new), str(old), str(a100), "--out", str(tmp_path), "--stem", "x"])
    err = capsys.readouterr().err
    assert "ran on compute capability 8.0, an earlier run on 9.0" in err and "one kind of GPU" in err
    assert not (tmp_path / "x_policy.json").exists()


def test_from_several_runs_keeps_a_point_only_where_every_run_won(tmp_path, capsys):
    """Two runs of one shape: 16 tokens won at 0.5 % in the first run and lost in the second, so it stays dense; 512
    tokens won at 0.5-1 % in both, at 2 % only in the first; one token won in both runs at the densities each drew.
    The calls between one and 16 tokens, not timed, take 16's answer, dense."""
    a = _run_file(tmp_path / "a.json", (2048, 5632), ((1, 0.02, 1.15), (16, 0.005, 1.2), (512, 0.005, 1.2),
                                                       (512, 0.01, 1.15), (512, 0.02, 1.06)), commit="aaaaaaa")
    b = _run_file(tmp_path / "b.json", (2048, 5632), ((1, 0.03, 1.17), (16, 0.005, 0.97), (512, 0.005, 1.25),
                                                       (512, 0.01, 1.16), (512, 0.02, 0.91)), commit="bbbbbbb")
    assert cli.main(["tune-dispatch", "--from", str(a), str(b), "--out", str(tmp_path), "--stem", "both"]) == 0
    policy_file = tmp_path / "both_policy.json"
    # 16 tokens lost inside one token's row, so 2-15 tokens (not timed) take its answer: dense
    assert load_policy(policy_file).table == ((1, 0.03), (2, 0.0), (512, 0.01))
    measured = json.loads(policy_file.read_text())["measured"]
    assert [r["commit"] for r in measured["runs"]] == ["aaaaaaa", "bbbbbbb"]
    assert len(measured["points"]) == 10
    assert "2 <= M < 512: dense" in capsys.readouterr().out
    # either run alone gives another table: the merge is not the first or the last run's
    assert cli.main(["tune-dispatch", "--from", str(a), "--out", str(tmp_path), "--stem", "one"]) == 0
    assert load_policy(tmp_path / "one_policy.json").table == ((1, 0.02), (16, 0.005), (512, 0.02))
    assert cli.main(["tune-dispatch", "--from", str(b), "--out", str(tmp_path), "--stem", "two"]) == 0
    assert load_policy(tmp_path / "two_policy.json").table == ((1, 0.03), (2, 0.0), (512, 0.01))


def test_from_several_runs_pairs_points_by_their_target_density(tmp_path, capsys):
    """Session 31's case: at 16 tokens the 5 % target drew 5.12 % in one run (a win) and 5.2 % in the other (a loss).
    Taken as two points by their drawn densities, the win came first and the table ran to 5.12 %; paired by target,
    the point lost, and the row stops at the 2 % target, at the higher of its two draws."""
    def run(path, points, commit):
        rows = [{"d": 2048, "f": 8192, "m": 16, "density_pct": pct, "density": dens, "dense_ms": 1.0,
                 "sparse_ms": 1.0 / s, "ok": True, "sparse_path": "sparse"} for pct, dens, s in points]
        path.write_text(json.dumps({"meta": {"shape": [2048, 8192], "device_type": "cuda", "commit": commit},
                                    "rows": rows}))
        return path

    a = run(tmp_path / "a.json", ((2.0, 0.0209, 1.19), (5.0, 0.0512, 1.07)), "aaaaaaa")
    b = run(tmp_path / "b.json", ((2.0, 0.0201, 1.17), (5.0, 0.0520, 0.99)), "bbbbbbb")
    assert cli.main(["tune-dispatch", "--from", str(a), str(b), "--out", str(tmp_path), "--stem", "paired"]) == 0
    assert load_policy(tmp_path / "paired_policy.json").table == ((16, 0.0209),)
    assert "M >= 16: sparse when density <= 2.09 %" in capsys.readouterr().out


def test_a_run_of_an_unmeasured_shape_reports_how_the_shipped_envelope_fared(tmp_path, capsys):
    """Measured H200 shapes bracket 4096 x 12288, so DEFAULT_POLICY sends it their envelope: one token to 5.08 %,
    dense at 16-1023 tokens, sparse from 1024 to ~10 %.  Of these points it sends four sparse, and the report names
    the one of them that lost (M=2048 at 5 %) and its lowest speedup; the points it keeps dense (16 tokens, and one
    token at 8 %) do not count, won or lost."""
    run = _run_file(tmp_path / "a.json", (4096, 12288), ((1, 0.005, 1.3), (1, 0.08, 1.2), (16, 0.005, 0.8),
                                                        (2048, 0.005, 1.4), (2048, 0.05, 0.97), (131072, 0.05, 1.3)))
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "held_out"]) == 0
    out = capsys.readouterr().out
    assert ("DEFAULT_POLICY (H200 tables) at 4096x12288: the envelope of the measured shapes around it (4096x11008, "
            "4096x14336, 5120x13824); 4 of 6 points sparse, lowest 0.97x (M=2048, density 5.00 %); losses: M=2048 "
            "5.00 %: 0.97x") in out
    check = json.loads((tmp_path / "held_out_policy.json").read_text())["measured"]["default_policy"]
    assert check["rule"] == "envelope" and check["sparse_points"] == 4
    assert check["bracket"] == [[4096, 11008], [4096, 14336], [5120, 13824]]
    assert [(x["m"], x["density"]) for x in check["losses"]] == [(2048, 0.05)]
    # a measured shape follows its own table; a shape outside the ranges is dense, so nothing of it is sparse
    own = _run_file(tmp_path / "b.json", (2048, 5632), ((1, 0.005, 1.2), (16, 0.005, 0.9)))
    assert cli.main(["tune-dispatch", "--from", str(own), "--out", str(tmp_path), "--stem", "own"]) == 0
    assert "at 2048x5632: its own measured table; 1 of 2 points sparse, lowest 1.20x" in capsys.readouterr().out
    far = _run_file(tmp_path / "c.json", (8192, 28672), ((16384, 0.005, 2.0),))
    assert cli.main(["tune-dispatch", "--from", str(far), "--out", str(tmp_path), "--stem", "far"]) == 0
    assert ("at 8192x28672: dense (no measured shapes around it); 0 of 1 points sparse; losses: none"
            in capsys.readouterr().out)


def test_from_refuses_runs_of_different_shapes_or_devices(tmp_path, capsys):
    a = _run_file(tmp_path / "a.json", (2048, 5632), ((512, 0.005, 1.2),))
    for other, said in ((_run_file(tmp_path / "b.json", (4096, 14336), ((512, 0.005, 1.2),)), "4096x14336 on cuda"),
                        (_run_file(tmp_path / "c.json", (2048, 5632), ((512, 0.005, 1.2),), device_type="cpu"),
                         "2048x5632 on cpu")):
        with pytest.raises(SystemExit):
            cli.main(["tune-dispatch", "--from", str(a), str(other), "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert said in err and "one policy needs runs of one shape and device" in err
    assert not (tmp_path / "dispatch_2048x5632_policy.json").exists()


def test_bad_arguments_are_refused_with_the_accepted_form(capsys, tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"meta": {}, "rows": []}))
    three = tmp_path / "three.json"  # a shape of three sizes
    three.write_text(json.dumps({"meta": {"shape": [1, 2, 3], "device_type": "cuda"}, "rows": []}))
    for path in (bad, three, tmp_path / "missing.json"):
        with pytest.raises(SystemExit):
            cli.main(["tune-dispatch", "--from", str(path)])
        assert "not a twell tune-dispatch run" in capsys.readouterr().err
    for argv, msg in ((["--ms", "8"], "--shape is required"), (["--shape", "64by256"], "shape must be HIDDENxFFN"),
                      (["--shape", "64x256", "--min-speedup", "0.9"], "--min-speedup must be >= 1"),
                      (["--shape", "64x256", "--densities", "0"], "--densities in \\(0, 100\\]")):
        with pytest.raises(SystemExit):
            cli.main(["tune-dispatch", *argv])
        assert msg.replace("\\", "") in capsys.readouterr().err


def test_eager_timing_adds_each_points_eager_figures_and_the_policys_floor(tmp_path, capsys):
    code = cli.main(["tune-dispatch", "--shape", "64x256", "--ms", "8", "--densities", "5", "--dtype", "float32",
                     "--rep-ms", "1", "--eager", "--out", str(tmp_path)])
    assert code == 0
    (row,) = json.loads((tmp_path / "dispatch_64x256.json").read_text())["rows"]
    assert row["eager_dense_ms"] > 0 and row["eager_sparse_ms"] > 0
    assert row["eager_speedup"] == pytest.approx(row["eager_dense_ms"] / row["eager_sparse_ms"])
    saved = json.loads((tmp_path / "dispatch_64x256_policy.json").read_text())
    assert saved["measured"]["eager_bar"] == 1.0 and "eager_sparse_ms" in saved["measured"]["points"][0]
    policy = load_policy(tmp_path / "dispatch_64x256_policy.json")
    out = capsys.readouterr().out
    # what the table sends sparse on this CPU decides; the floor printed is the one saved
    assert f"eager_min_tokens={policy.eager_min_tokens}" in out and "; eager " in out  # the row shows its eager figures


def _eager_run(path, eager_speedups):
    """A recorded run at 2048 x 5632 whose held timings win everywhere (1.5x) and whose eager ones are given."""
    rows = [{"d": 2048, "f": 5632, "m": m, "density": 0.005, "dense_ms": 1.0, "sparse_ms": 1.0 / 1.5, "ok": True,
             "sparse_path": "sparse", "eager_dense_ms": 1.0, "eager_sparse_ms": 1.0 / s} for m, s in eager_speedups]
    path.write_text(json.dumps({"meta": {"shape": [2048, 5632], "device_type": "cuda", "device": "NVIDIA H200",
                                         "dtype": "bfloat16"}, "rows": rows}))
    return path


def test_from_derives_the_eager_floor_from_the_points_the_table_sends_sparse(tmp_path, capsys):
    run = _eager_run(tmp_path / "run.json", ((512, 0.4), (1024, 0.8), (2048, 1.1), (16384, 1.4)))
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "a"]) == 0
    policy = load_policy(tmp_path / "a_policy.json")
    assert policy.table == ((512, 0.005),) and policy.eager_min_tokens == 2048
    assert not policy.use_sparse(1024, 0.005, shape=(2048, 5632), eager=True)
    assert policy.use_sparse(1024, 0.005, shape=(2048, 5632))  # calls not eager keep the table
    out = capsys.readouterr().out
    assert "eager_min_tokens=2048" in out and "in dense FFN work 6 x 2048 x 2048 x 5632 = 1.42e+11 FLOPs" in out
    # the shipped default's floor at the shape, to compare with (twell.nn.EAGER_MIN_FLOPS: 8937 tokens here)
    assert "the default policy's eager floor at 2048x5632: 8937 tokens (eager_min_flops 6.18e+11" in out
    # a lower bar: no eager call lost by it
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "b",
                     "--eager-bar", "0.3"]) == 0
    assert load_policy(tmp_path / "b_policy.json").eager_min_tokens == 0
    assert "no floor (eager_min_tokens=0)" in capsys.readouterr().out


def test_from_a_run_without_eager_timings_sets_no_floor_and_says_nothing_of_it(tmp_path, capsys):
    run = _run_file(tmp_path / "plain.json", (2048, 5632), ((512, 0.005, 1.2),))
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "p"]) == 0
    assert load_policy(tmp_path / "p_policy.json").eager_min_tokens == 0
    assert "eager calls" not in capsys.readouterr().out


def test_an_eager_loss_where_the_table_runs_dense_does_not_raise_the_floor(tmp_path):
    run = _eager_run(tmp_path / "run.json", ((512, 0.4), (1024, 1.2)))
    rows = json.loads(run.read_text())
    rows["rows"][0]["sparse_ms"] = 1.0  # 512 tokens: no held win, so the table runs it dense
    run.write_text(json.dumps(rows))
    assert cli.main(["tune-dispatch", "--from", str(run), "--out", str(tmp_path), "--stem", "d"]) == 0
    policy = load_policy(tmp_path / "d_policy.json")
    assert policy.table == ((1024, 0.005),) and policy.eager_min_tokens == 0


def test_a_bad_eager_bar_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["tune-dispatch", "--shape", "64x256", "--eager", "--eager-bar", "0", "--out", str(tmp_path)])
    assert "--eager-bar must lie in (0, 2]" in capsys.readouterr().err


def test_the_position_profile_is_set_recorded_and_a_density_it_cannot_reach_is_an_error_row(tmp_path, capsys):
    # 64 x 256 keeps 179 live units (30 % dead): a 40x head at 1 % asks for 102 at position 0, at 10 % for 1024
    code = cli.main(["tune-dispatch", "--shape", "64x256", "--ms", "8", "2048", "--densities", "1", "10",
                     "--dtype", "float32", "--rep-ms", "1", "--early-boost", "40", "--early-decay", "4",
                     "--out", str(tmp_path)])
    assert code == 0
    run = json.loads((tmp_path / "dispatch_64x256.json").read_text())
    assert run["meta"]["early_boost"] == 40.0 and run["meta"]["early_decay"] == 4.0
    timed = [r for r in run["rows"] if "error" not in r]
    failed = [r for r in run["rows"] if "error" in r]
    assert [(r["m"], r["density_pct"]) for r in timed] == [(8, 1.0), (2048, 1.0)]
    assert all(r["ok"] for r in timed)
    # whole-sequence call (2048 tokens from position 0): the head carries the boost
    assert [(r["m"], r["density_pct"]) for r in failed] == [(8, 10.0), (2048, 10.0)]
    assert all(r["error"].startswith("profile: ") and "units are alive" in r["error"] for r in failed)
    assert "ERROR profile: " in capsys.readouterr().out


def test_a_position_profile_the_sequence_cannot_carry_is_refused_before_timing(tmp_path, capsys):
    for argv, msg in ((["--early-boost", "0.5"], "early_boost must be >= 1"),
                      (["--early-boost", "1000", "--early-decay", "32"], "cannot keep a mean of 1"),
                      (["--early-decay", "0"], "early_decay must be > 0")):
        with pytest.raises(SystemExit):
            cli.main(["tune-dispatch", "--shape", "64x256", "--out", str(tmp_path), *argv])
        err = capsys.readouterr().err
        assert "--early-boost / --early-decay: " in err and msg in err
    assert not list(tmp_path.iterdir())  # nothing was timed or written


def test_the_documented_steep_head_gives_the_models_ratio():
    """README / tune-dispatch: --early-boost 40 --early-decay 4 at 2048x5632 / 0.5 % fires ~17x more units at the
    first 8 positions of a sequence than at the rest (the 1.5B benchmark model's layers: 14-41x)."""
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator()
    gen.manual_seed(0)
    p = synthetic_ffn_problem(2048, 2048, 5632, SparsityProfile(mean_l0=0.005 * 5632, early_boost=40, early_decay=4),
                              generator=gen, dtype=torch.float32)
    active = (torch.relu(p["x"] @ p["w_gate"].T) > 0).sum(1).float()
    ratio = float(active[:8].mean() / active[8:].mean())
    assert 15.0 < ratio < 19.0, ratio
