"""`twell info`'s dispatch lines (twell.nn.dispatch_summary): which condition of a policy sends the layers dense on a
device, and what the shipped policies do where their tables apply."""

from __future__ import annotations

import pytest

from twell.cli import main
from twell.nn import DEFAULT_POLICY, H200_BF16_SHAPES, DispatchPolicy
from twell.nn.dispatch_summary import inference_summary, training_summary
from twell.nn.train_dispatch import DEFAULT_TRAIN_POLICY, TrainDispatchPolicy
from twell.ops import DECODE_MAX_TOKENS


def test_default_policy_on_hopper_names_every_measured_shape_and_the_envelope():
    text = inference_summary(DEFAULT_POLICY, "cuda", (9, 0))
    assert text.startswith(f"measured tables for {len(H200_BF16_SHAPES)} layer shapes")
    for d, f in H200_BF16_SHAPES:
        assert f"{d}x{f}" in text
    assert "follows their envelope" in text
    assert f"calls of 1-{DECODE_MAX_TOKENS} tokens follow the decode tables" in text


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (7, 5), (10, 0)])
def test_default_policies_off_hopper_say_dense_with_the_capability_and_what_measures_one(capability):
    for text, tool in ((inference_summary(DEFAULT_POLICY, "cuda", capability), "twell tune-dispatch"),
                       (training_summary(DEFAULT_TRAIN_POLICY, "cuda", capability), "twell bench train-ffn")):
        assert text.startswith(f"dense on this GPU (compute capability {capability[0]}.{capability[1]})")
        assert "the tables hold for 9.0" in text
        assert tool in text


def test_default_policies_on_cpu_say_dense_and_where_they_were_measured():
    for text in (inference_summary(DEFAULT_POLICY, "cpu", None), training_summary(DEFAULT_TRAIN_POLICY, "cpu", None)):
        assert text.startswith("dense on cpu: the tables were measured on cuda")


def test_unknown_capability_is_not_held_back():
    # capability None on CUDA: the caller does not know it, as capability_allowed treats it (not held back)
    assert inference_summary(DEFAULT_POLICY, "cuda", None) == inference_summary(DEFAULT_POLICY, "cuda", (9, 0))


def test_default_training_policy_names_its_shape_and_dtype():
    text = training_summary(DEFAULT_TRAIN_POLICY, "cuda", (9, 0))
    shapes = [f"{d}x{f}" for (d, f), table in DEFAULT_TRAIN_POLICY.tables.items() if table]
    assert shapes and text == f"sparse training op in bfloat16 for {', '.join(sorted(shapes))}; other shapes run dense"


def test_forced_and_shape_free_policies():
    assert inference_summary(DispatchPolicy.always_sparse(), "cpu", None).startswith("forced")
    assert training_summary(TrainDispatchPolicy.always_sparse(), "cpu", None).startswith("forced")
    # no capability limit: an A100 takes a shape-free table
    assert inference_summary(DispatchPolicy(shapes=None), "cuda", (8, 0)) == "one table for every layer shape"
    assert (inference_summary(DispatchPolicy(shapes=None, shape_tables=(((64, 128), ((1, 0.5),)),)), "cuda", None)
            == "one table for every layer shape; its own table for 1 shapes (64x128)")
    assert (inference_summary(DispatchPolicy(shapes=((64, 128),), table=((1, 0.5),)), "cuda", None)
            == "measured tables for 1 layer shapes (64x128); other shapes run dense")


def test_training_policy_without_a_sparse_table_says_dense():
    assert training_summary(TrainDispatchPolicy(tables={}), "cuda", (9, 0)) == (
        "dense for every layer shape (no table sends a call sparse)")
    text = training_summary(TrainDispatchPolicy(tables={}, default_table=((1, 0.1),)), "cuda", (9, 0))
    assert text == "sparse training op in bfloat16 for every layer shape, by the default table"
    text = training_summary(TrainDispatchPolicy(default_table=((1, 0.1),)), "cuda", (9, 0))
    assert text.endswith("for 2048x5632; other shapes follow the default table")


def test_info_prints_both_dispatch_lines(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line}
    assert lines["inference dispatch (DEFAULT_POLICY)"]
    assert lines["training dispatch (DEFAULT_TRAIN_POLICY)"]
