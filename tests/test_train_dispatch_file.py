"""A training dispatch policy as a JSON file (twell.nn.train_dispatch_file): round trips, the checks on every field,
and set_train_dispatch_policy giving it to a model's layers."""

from __future__ import annotations

import json

import pytest
import torch

from twell.nn import SparseGatedMLP, load_train_policy, save_train_policy
from twell.nn.dispatch import HOPPER
from twell.nn.train_dispatch import DEFAULT_TRAIN_POLICY, TrainDispatchPolicy
from twell.nn.train_dispatch_file import TRAIN_POLICY_FORMAT, train_policy_from_dict, train_policy_to_dict


def _same(a: TrainDispatchPolicy, b: TrainDispatchPolicy) -> None:
    for name in ("tables", "default_table", "device_types", "dtypes", "force", "capabilities"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize("policy", [
    DEFAULT_TRAIN_POLICY,
    TrainDispatchPolicy(tables={(64, 256): ((16, 0.05), (1024, 0.1)), (32, 128): ()}, default_table=((4096, 0.02),),
                        device_types=("cuda", "cpu"), dtypes=(torch.float16, torch.float32), capabilities=((8, 0),)),
    TrainDispatchPolicy.always_sparse(),
    TrainDispatchPolicy.always_dense(),
], ids=["default", "two-shapes", "always-sparse", "always-dense"])
def test_round_trip_through_a_file(tmp_path, policy):
    path = save_train_policy(policy, tmp_path / "sub" / "p.json", measured={"device": "test"})
    data = json.loads(path.read_text())
    assert data["format"] == TRAIN_POLICY_FORMAT and data["measured"] == {"device": "test"}
    _same(load_train_policy(path), policy)


def test_the_default_policy_file_keeps_its_hopper_limit():
    data = train_policy_to_dict(DEFAULT_TRAIN_POLICY)
    assert data["capabilities"] == [list(c) for c in HOPPER] and data["dtypes"] == ["bfloat16"]
    assert train_policy_from_dict(data).capabilities == HOPPER


def _good() -> dict:
    return train_policy_to_dict(TrainDispatchPolicy(tables={(64, 256): ((16, 0.05),)}))


@pytest.mark.parametrize(("edit", "error", "match"), [
    (lambda d: d.update(format="twell.dispatch_policy"), ValueError, "load_policy"),
    (lambda d: d.update(version=2), ValueError, "version 2"),
    (lambda d: d.update(tabels=[]), ValueError, "unknown keys \\['tabels'\\]"),
    (lambda d: d.pop("dtypes"), ValueError, "missing keys \\['dtypes'\\]"),
    (lambda d: d.update(dtypes=["bf16"]), ValueError, "unknown dtypes \\['bf16'\\].*bfloat16"),
    (lambda d: d.update(device_types="cuda"), TypeError, "device_types must be a list of strings"),
    (lambda d: d.update(tables={"64x256": []}), TypeError, "tables must be a list"),
    (lambda d: d["tables"][0].update(shape=[64.5, 256]), TypeError, "ints > 0"),
    (lambda d: d["tables"][0].update(shape=[64]), TypeError, "\\[hidden_size, intermediate_size\\]"),
    (lambda d: d["tables"].append(dict(d["tables"][0])), ValueError, "appears twice"),
    (lambda d: d["tables"][0].update(table=[[16, 0.05], [8, 0.1]]), ValueError, "strictly increasing"),
    (lambda d: d["tables"][0].update(table=[[16, 1.5]]), ValueError, "density"),
    (lambda d: d.update(capabilities=[[9]]), TypeError, "capabilities"),
    (lambda d: d.update(force="yes"), TypeError, "force must be a bool"),
], ids=["inference-format", "version", "unknown-key", "missing", "dtype-name", "device-types", "tables-dict",
        "float-size", "one-size", "twice", "unsorted", "density", "capability", "force"])
def test_bad_fields_are_refused_with_the_reason(edit, error, match):
    data = _good()
    edit(data)
    with pytest.raises(error, match=match):
        train_policy_from_dict(data, source="p.json")


def test_not_json_and_not_an_object(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_train_policy(path)
    with pytest.raises(TypeError, match="must be a JSON object"):
        train_policy_from_dict([1])
    with pytest.raises(TypeError, match="TrainDispatchPolicy"):
        train_policy_to_dict(object())  # type: ignore[arg-type]


def test_a_dtype_without_a_file_name_is_refused():
    with pytest.raises(ValueError, match="accepted"):
        train_policy_to_dict(TrainDispatchPolicy(dtypes=(torch.float64,)))


def test_set_train_dispatch_policy_reaches_every_layer_and_restarts_its_switch():
    from torch import nn

    from twell.models import set_train_dispatch_policy

    layers = nn.ModuleList([SparseGatedMLP(32, 128, train_impl="auto") for _ in range(3)])
    layers[1]._train_switch.estimate = 5.0
    policy = TrainDispatchPolicy(tables={(32, 128): ((1, 0.5),)}, device_types=("cpu",), dtypes=(torch.float32,))
    assert set_train_dispatch_policy(layers, policy) == 3
    assert all(m.train_policy is policy and m._train_switch.estimate is None for m in layers)
    assert set_train_dispatch_policy(layers, None) == 3
    assert all(m.train_policy is DEFAULT_TRAIN_POLICY for m in layers)
    with pytest.raises(TypeError, match="TrainDispatchPolicy or None"):
        set_train_dispatch_policy(layers, "dense")  # type: ignore[arg-type]
