"""``twell tune-decode`` end to end on a tiny CPU layer (eager timing: a smoke test of the command), its policy file,
its table text and its bad arguments."""

from __future__ import annotations

import json
import re

import pytest
import torch

from twell import cli
from twell.bench.tune_decode import copies_for, decode_policy, points_of, table_text
from twell.nn import DEFAULT_POLICY, DispatchPolicy, load_policy
from twell.nn.dispatch_tuning import derive_decode_table
from twell.tolerances import REL_TOL


def test_tuning_a_tiny_layer_writes_checked_points_and_a_loadable_policy(tmp_path, capsys):
    code = cli.main(["tune-decode", "--shape", "64x256", "--ms", "1", "3", "--densities", "5", "--dtype", "float32",
                     "--rep-ms", "1", "--out", str(tmp_path)])
    assert code == 0
    run = json.loads((tmp_path / "decode_64x256.json").read_text())
    assert run["meta"]["shape"] == [64, 256] and run["meta"]["timing"] == "eager"
    assert [r["m"] for r in run["rows"]] == [1, 3]
    for r in run["rows"]:
        assert r["ok"] and r["path"] == "decode" and r["rel_err"] < REL_TOL[torch.float32]
        assert 0 <= r["dense_rel_err"] < REL_TOL[torch.float32]
        assert r["dense_ms"] > 0 and r["sparse_ms"] > 0 and r["copies"] == 1
        assert r["speedup"] == pytest.approx(r["dense_ms"] / r["sparse_ms"])
        assert r["density"] == pytest.approx(r["l0"] / 256) and r["l0"] > 0
        assert r["l0"] <= r["union"] <= r["m"] * 256
    policy = load_policy(tmp_path / "decode_64x256_policy.json")
    table = derive_decode_table(points_of(run["rows"]), max_tokens=64)
    assert policy.decode_table_for((64, 256)) == table
    # the shipped policy otherwise: its inference tables and the other shapes' decode tables kept
    assert policy.shape_tables == DEFAULT_POLICY.shape_tables and not policy.decode_graphed
    assert "decode table for 64x256 on cpu" in capsys.readouterr().out


def test_decode_policy_replaces_only_its_shape_and_table_text_reads_the_rows():
    base = decode_policy(((1, 0.1),), d=2048, f=5632, base=DispatchPolicy())
    both = decode_policy(((2, 0.02), (16, 0.0)), d=4096, f=14336, base=base)
    assert both.decode_table_for((2048, 5632)) == ((1, 0.1),)
    assert both.decode_table_for((4096, 14336)) == ((2, 0.02), (16, 0.0))
    again = decode_policy(((1, 0.05),), d=2048, f=5632, base=both)
    assert again.decode_table_for((2048, 5632)) == ((1, 0.05),) and len(again.decode_tables) == 2
    text = table_text(((2, 0.02), (16, 0.0)))
    assert "2 <= M < 16: small-batch kernels when density <= 2 %" in text and "16 <= M < 65: dense" in text
    assert "never won" in table_text(()) and "never won" in table_text(((1, 0.0),))
    shipped = decode_policy(((1, 0.05),), d=2048, f=5632)  # from the default policy: the other shapes' tables kept
    assert len(shipped.decode_tables) == len(DEFAULT_POLICY.decode_tables)
    assert shipped.decode_table_for((4096, 14336)) == DEFAULT_POLICY.decode_table_for((4096, 14336))
    assert copies_for(70 * 2**20, torch.device("cpu")) == 1


@pytest.mark.parametrize("args, msg", [
    (["--shape", "64x256", "--ms", "65"], "--ms must lie in \\[1, 64\\]"),
    (["--shape", "64x256", "--ms", "0"], "--ms must lie in \\[1, 64\\]"),
    (["--shape", "64x256", "--densities", "0"], "--densities must lie in \\(0, 100\\]"),
    (["--shape", "64x256", "--min-speedup", "0.9"], "--min-speedup must be >= 1"),
    (["--ms", "1"], "--shape"),
])
def test_bad_arguments_are_refused_with_the_problem_named(tmp_path, capsys, args, msg):
    with pytest.raises(SystemExit):
        cli.main(["tune-decode", *args, "--out", str(tmp_path)])
    assert re.search(msg, capsys.readouterr().err)
