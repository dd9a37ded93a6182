"""The auxiliary top-K loss on dead units: bookkeeping, where its gradient goes, and that it revives units."""

import pytest
import torch

from rankwise.errors import InvalidInputError
from rankwise.nn.lorsa import FitConfig, Lorsa, TopKSAE, fit
from rankwise.nn.lorsa.auxk import DeadUnits, aux_loss
from rankwise.nn.lorsa.topk import top_k

from test_lorsa_fit import CFG, _data  # the planted sparse attention layer those tests fit

pytestmark = pytest.mark.method("lorsa")
def test_dead_units_count_steps_since_selected():
    d = DeadUnits(5, dead_steps=2)
    d.update(torch.tensor([[0, 1]]))
    d.update(torch.tensor([[1, 2]]))
    assert d.idle.tolist() == [1, 0, 0, 2, 2]
    assert d.mask().tolist() == [False, False, False, True, True]
    d.update(torch.tensor([[3, 3]]))  # a repeated index counts once
    assert d.idle.tolist() == [2, 1, 1, 0, 3]


def test_codes_then_decode_is_the_forward():
    x, y = _data()
    for module, inp in ((Lorsa(CFG), x), (TopKSAE(12, 16, 4), y)):
        with torch.no_grad():
            assert torch.equal(module.decode(*top_k(*module.codes(inp), 4)), module(inp))


def test_aux_gradient_reaches_only_the_dead_heads():
    x, y = _data()
    m = Lorsa(CFG)
    scores, values = m.codes(x[:4])
    dead = torch.zeros(16, dtype=torch.bool)
    dead[[2, 5, 11]] = True
    residual = torch.randn(4, 10, 12)
    aux_loss(scores, values, dead, residual, aux_k=2, readout=m.readout).backward()
    touched = m.W_O.grad.abs().sum(-1) > 0
    assert touched.tolist() == dead.tolist()
    assert float(aux_loss(scores, values, torch.zeros(16, dtype=torch.bool), residual, 2, m.readout)) == 0.0


def test_aux_loss_revives_heads_the_top_k_never_picks():
    # Heads 8..15 write with a norm 1e-4 of the others': the main top-K (ranked by |z| ||w_o||) never selects them,
    # so without the auxiliary term they get no gradient at all and stay dead; with it they learn to write the residual.
    x, y = _data()
    dead_after = {}
    for aux_k in (0, 4):
        torch.manual_seed(1)
        m = Lorsa(CFG)
        with torch.no_grad():
            m.W_O[8:] *= 1e-4
        r = fit(m, x, y, FitConfig(steps=120, lr=1e-2, batch_size=8, aux_k=aux_k, dead_steps=5))
        used = (m.sparse_activations(x) != 0).flatten(0, 1).any(0)
        dead_after[aux_k] = (int((~used[8:]).sum()), r.dead_fraction)
    assert dead_after[0][0] == 8  # by construction, the control
    assert dead_after[4][0] < 4  # at least half revived (all 8 here)


def test_aux_settings_are_checked():
    for bad in ({"aux_k": -1}, {"dead_steps": 0}, {"aux_coef": float("nan")}, {"aux_coef": -1.0}):
        with pytest.raises(InvalidInputError, match="aux_k"):
            FitConfig(steps=1, lr=1e-3, **bad)
