from __future__ import annotations

import torch
from test_train_helpers import StandIn

from twell.train.dead_units import DeadUnitTracker, revive_dead_units
from twell.train.l1 import sparse_layers


def _kill(model: StandIn, layer: int, units: list[int]) -> None:
    with torch.no_grad():
        w = sparse_layers(model)[layer].gate_proj.weight
        w[units] = 0.0  # g = 0 for every token: relu(0) = 0, never fires


def test_tracker_counts_tokens_and_flags_dead_units() -> None:
    torch.manual_seed(0)
    model = StandIn().train()
    _kill(model, 0, [3, 5])
    tracker = DeadUnitTracker(model, window_tokens=40)
    ids = torch.randint(0, 256, (2, 10))  # 20 tokens per forward
    model(ids)
    tracker.step()
    assert int(tracker.since[0][3]) == 20 and tracker.dead_fraction() == 0.0
    model(ids)
    tracker.step()
    dead = tracker.dead_masks()
    assert dead[0].nonzero().flatten().tolist() == [3, 5]
    assert tracker.dead_fractions()[0] == 2 / 64
    # eval forwards are not counted
    model.eval()
    with torch.no_grad():
        model(ids)
    tracker.step()
    assert int(tracker.since[0][3]) == 40
    state = tracker.state_dict()
    t2 = DeadUnitTracker(model, window_tokens=1)
    t2.load_state_dict(state)
    assert t2.window_tokens == 40 and torch.equal(t2.since[0], tracker.since[0])
    tracker.close()
    t2.close()


def test_revival_blends_dead_rows_only_and_exactly() -> None:
    torch.manual_seed(0)
    model = StandIn().train()
    _kill(model, 1, [0, 7, 9])
    with torch.no_grad():
        sparse_layers(model)[1].gate_proj.weight[[0, 7, 9]] = 0.5  # dead but non-zero rows: g = 0.5 * sum(x)
    tracker = DeadUnitTracker(model, window_tokens=1)
    tracker.since[1][[0, 7, 9]] = 5  # mark dead by hand (window 1)
    before = [[p.detach().clone() for p in (m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)]
              for m in sparse_layers(model)]
    n = revive_dead_units(tracker, model, weight=0.1, std=0.02, generator=torch.Generator().manual_seed(3))
    assert n == 3
    noise = torch.randn((3, 32), generator=torch.Generator().manual_seed(3)) * 0.02
    after = [[p.detach() for p in (m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)]
             for m in sparse_layers(model)]
    idx = torch.tensor([0, 7, 9])
    torch.testing.assert_close(after[1][0][idx], 0.9 * before[1][0][idx] + 0.1 * noise, rtol=0, atol=0)
    live = torch.ones(64, dtype=torch.bool)
    live[idx] = False
    assert torch.equal(after[1][0][live], before[1][0][live])  # live rows untouched, bitwise
    for layer in range(2):
        assert torch.equal(after[layer][1], before[layer][1]) and torch.equal(after[layer][2], before[layer][2])
    assert torch.equal(after[0][0], before[0][0])
    assert revive_dead_units(tracker, model, weight=0.1) == 3  # still dead: blended again next step
    tracker.close()
