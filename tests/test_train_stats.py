from __future__ import annotations

import json

import torch
from test_train_helpers import StandIn

from twell.tolerances import ABS_TOL_MEAN_OF_MEANS
from twell.train.stats import SCHEMA, collect_sparsity, load_patterns, plot_history, save_patterns, save_sparsity


def test_report_schema_plots_and_patterns(tmp_path) -> None:
    torch.manual_seed(0)
    model = StandIn().train()
    batches = [torch.randint(0, 256, (3, 12)) for _ in range(2)]
    report, patterns = collect_sparsity(model, batches, capture_tokens=30)
    assert model.training  # mode restored
    assert report["schema"] == SCHEMA and report["n_layers"] == 2 and report["tokens"] == 72
    for lay in report["layers"]:
        assert set(lay) >= {"index", "n_units", "l0_mean", "l0_max", "dead_fraction", "top10_share",
                            "l0_by_position", "firing_frequency_hist", "density"}
        assert len(lay["l0_by_position"]) == 12
        assert abs(sum(lay["l0_by_position"]) / 12 - lay["l0_mean"]) < ABS_TOL_MEAN_OF_MEANS
        h = lay["firing_frequency_hist"]
        assert sum(h["counts"]) + h["zero_units"] == 64
    # the recorded pattern is exactly relu(x Wg^T) != 0 of the layer input
    xs: list[torch.Tensor] = []
    hk = model.mlps[0].register_forward_hook(lambda m, i, o: xs.append(i[0].reshape(-1, 32)))
    model.eval()
    with torch.no_grad():
        model(batches[0])
        model(batches[1])
    hk.remove()
    x = torch.cat(xs)[:30]
    expect = torch.relu(x @ model.mlps[0].gate_proj.weight.T) != 0
    assert torch.equal(patterns[0].to_mask(), expect)
    paths = save_sparsity(report, tmp_path)
    assert [p.name for p in paths] == ["sparsity.json", "sparsity_layers.png", "sparsity_positions.png",
                                       "sparsity_frequency.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert json.loads((tmp_path / "sparsity.json").read_text())["schema"] == SCHEMA
    save_patterns(tmp_path / "p.npz", patterns)
    loaded = load_patterns(tmp_path / "p.npz")
    assert [p.n_tokens for p in loaded] == [30, 30] and loaded[0].seq_len == 12
    assert torch.equal(loaded[1].to_mask(), patterns[1].to_mask())
    logs = [{"step": i, "lm_loss": 5 - i, "l0": 10.0 / (i + 1), "dead_fraction": 0.0, "eval_loss": None}
            for i in range(5)]
    assert plot_history({"a": logs}, tmp_path / "h.png").stat().st_size > 0
