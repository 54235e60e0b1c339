"""Dispatch policies as JSON files: round trip, provenance kept, every malformed file refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from twell.models import set_dispatch_policy
from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP, load_policy, save_policy
from twell.nn.dispatch_file import POLICY_FORMAT, policy_from_dict, policy_to_dict


def test_round_trip_keeps_every_field_and_the_provenance(tmp_path):
    policy = DispatchPolicy(table=((4096, 0.005), (16384, 0.05)), device_types=("cuda",), shapes=((4096, 11008),),
                            decode_max_tokens=1)
    path = save_policy(policy, tmp_path / "sub" / "p.json", measured={"device": "NVIDIA H200", "points": [1, 2]})
    assert load_policy(path) == policy
    assert json.loads(path.read_text())["measured"] == {"device": "NVIDIA H200", "points": [1, 2]}
    anyshape = DispatchPolicy(table=(), shapes=None, force=True)
    assert policy_from_dict(policy_to_dict(anyshape)) == anyshape
    assert policy_from_dict(policy_to_dict(DEFAULT_POLICY)) == DEFAULT_POLICY  # its per-shape table too
    older = policy_to_dict(policy)
    del older["shape_tables"]  # files written before per-shape tables
    assert policy_from_dict(older) == policy
    before_envelope = policy_to_dict(DEFAULT_POLICY)
    assert before_envelope["other_shapes"] == "envelope"
    del before_envelope["other_shapes"]  # files written before session 32: other shapes ran dense, and still do
    assert policy_from_dict(before_envelope).other_shapes == "dense"
    graphed = DispatchPolicy(decode_tables=(((2048, 5632), ((1, 0.1), (8, 0.02), (32, 0.0))),), decode_graphed=True)
    assert load_policy(save_policy(graphed, tmp_path / "g.json")) == graphed
    before_decode = policy_to_dict(graphed)
    del before_decode["decode_tables"], before_decode["decode_graphed"]  # files written before session 34
    assert policy_from_dict(before_decode) == DispatchPolicy()


def test_a_loaded_policy_drives_the_layers_of_its_shape(tmp_path):
    policy = DispatchPolicy(table=((0, 1.0),), device_types=("cpu",), shapes=((32, 64),))
    path = save_policy(policy, tmp_path / "p.json")
    model = torch.nn.Sequential(SparseGatedMLP(32, 64), SparseGatedMLP(32, 128))
    assert set_dispatch_policy(model, load_policy(path)) == 2
    assert model[0]._use_sparse(8, "cpu") and not model[0]._use_sparse(8, "cuda")
    assert not model[1]._use_sparse(8, "cpu")  # a shape the file was not measured for: dense


@pytest.mark.parametrize("edit, exc, msg", [
    (lambda d: d.update(format="other"), ValueError, "not a twell dispatch policy"),
    (lambda d: d.update(version=2), ValueError, "version 2 is not supported"),
    (lambda d: d.update(tabel=[]), ValueError, "unknown keys \\['tabel'\\]"),
    (lambda d: d.pop("shapes"), ValueError, "missing keys \\['shapes'\\]"),
    (lambda d: d.update(device_types="cuda"), TypeError, "device_types must be a list"),
    (lambda d: d.update(shapes=[[2048]]), TypeError, "each shape must be"),
    (lambda d: d.update(shapes={"a": 1}), TypeError, "shapes must be null or a list"),
    (lambda d: d.update(table=[[16384, 0.05], [4096, 0.1]]), ValueError, "strictly increasing min_tokens"),
    (lambda d: d.update(table=[[16384, 1.5]]), ValueError, "max_density must lie in \\[0, 1\\]"),
    (lambda d: d.update(force="yes"), TypeError, "force must be a bool"),
    (lambda d: d.update(shape_tables={"2048x5632": []}), TypeError, "shape_tables must be a list"),
    (lambda d: d.update(shape_tables=[{"shape": [2048, 5632]}]), TypeError, "shape_tables must be a list"),
    (lambda d: d.update(shape_tables=[{"shape": [2048, 5632], "table": [[16384, 2.0]]}]), ValueError,
     "shape_tables entry 0 \\(2048 x 5632\\): table row 0: max_density must lie in"),
    (lambda d: d.update(other_shapes="nearest"), ValueError, "other_shapes must be one of \\('dense', 'envelope'\\)"),
    (lambda d: d.update(decode_tables=[{"shape": [2048, 5632], "table": [[65, 0.01]]}]), ValueError,
     "decode_tables \\(2048 x 5632\\): rows must start at 1 to 64 tokens"),
    (lambda d: d.update(decode_tables=[{"shape": [2048, 5632], "table": [[0, 0.01]]}]), ValueError,
     "rows must start at 1 to 64 tokens"),
    (lambda d: d.update(decode_tables=[{"shape": [2048, 5632], "table": [[1, 1.5]]}]), ValueError,
     "decode_tables entry 0 \\(2048 x 5632\\): table row 0: max_density must lie in"),
    (lambda d: d.update(decode_tables={"2048x5632": []}), TypeError, "decode_tables must be a list"),
    (lambda d: d.update(decode_graphed=1), TypeError, "decode_graphed must be a bool"),
])
def test_malformed_files_are_refused_with_the_problem_named(tmp_path, edit, exc, msg):
    data = policy_to_dict(DispatchPolicy(table=((16384, 0.05),), shapes=((2048, 5632),)))
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(exc, match=msg):
        load_policy(path)


def test_not_json_or_not_an_object_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_policy(path)
    with pytest.raises(TypeError, match="must be a JSON object"):
        policy_from_dict([POLICY_FORMAT])
    with pytest.raises(TypeError, match="must be a twell.nn.DispatchPolicy"):
        policy_to_dict({"table": []})  # type: ignore[arg-type]
