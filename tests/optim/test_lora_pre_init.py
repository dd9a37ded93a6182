"""LoRA-Pre's two starts: the default zero start and the card's alternative, factors from the first gradient's SVD."""

from __future__ import annotations

import pytest
import torch

from rankwise.errors import InvalidInputError
from rankwise.optim import LoRAPre
from rankwise.optim.lora_pre_init import WARM_START_STEP, first_gradient_factor_state

pytestmark = pytest.mark.method("lora-pre")

F64 = torch.float64


def _rank_one_positive(p: int, q: int, seed: int) -> torch.Tensor:
    """g = u v^T with u, v > 0: rank 1, and |g| = g is rank 1 too. [p, q] float64"""
    gen = torch.Generator().manual_seed(seed)
    return torch.outer(torch.rand(p, generator=gen, dtype=F64) + 0.5, torch.rand(q, generator=gen, dtype=F64) + 0.5)


def _one_step(init: str, grad: torch.Tensor, rank: int, **kw) -> tuple[torch.Tensor, LoRAPre]:
    w = torch.nn.Parameter(torch.zeros_like(grad))
    opt = LoRAPre([w], lr=0.1, weight_decay=0.0, rank=rank, init=init, **kw)
    w.grad = grad.clone()
    opt.step()
    return w, opt


def test_svd_start_reconstructs_the_first_gradient_of_rank_at_most_r():
    g = _rank_one_positive(12, 9, 0) + _rank_one_positive(12, 9, 1)  # rank 2, |g| = g
    w = torch.nn.Parameter(torch.zeros_like(g))
    state = first_gradient_factor_state(w, g, 3, 0.02, 0, 0, ("m_B", "m_A", "v_B", "v_A"))
    scale = float(g.abs().max())
    tol = 1e3 * torch.finfo(F64).eps * scale  # float64 SVD rounding, times a generous factor for the products
    torch.testing.assert_close(state["m_B"] @ state["m_A"], g, atol=tol, rtol=0)
    torch.testing.assert_close(state["v_B"] @ state["v_A"], g.abs(), atol=tol, rtol=0)
    assert float(state["step"]) == WARM_START_STEP
    # the third direction has no singular value: B column 0, A row from the default start (invertible Gram)
    assert torch.count_nonzero(state["m_B"][:, 2]) == 0 and torch.count_nonzero(state["m_A"][2]) > 0


def test_svd_start_first_step_is_adams_first_step():
    """m = g and v = g^2 with no bias correction: the step is AdamW's first, lr * g / (|g| + eps)."""
    g = _rank_one_positive(10, 7, 2)  # |g| = g has rank 1 <= r, so v = g^2 exactly
    w, _ = _one_step("svd", g, rank=2)
    ref = torch.nn.Parameter(torch.zeros_like(g))
    adam = torch.optim.AdamW([ref], lr=0.1, weight_decay=0.0)
    ref.grad = g.clone()
    adam.step()
    torch.testing.assert_close(w.detach(), ref.detach(), atol=1e-12, rtol=1e-10)


def test_the_two_starts_differ_from_the_second_step():
    """Both first steps are Adam's (the zero start's corrections make it so); the second blends g_2 with the held
    moments: the zero start's factors hold only one regression step of g_1, the svd start's all of it."""
    g1, g2 = _rank_one_positive(8, 6, 4), _rank_one_positive(8, 6, 9)
    ws = []
    for init in ("zero", "svd"):
        w, opt = _one_step(init, g1, rank=2)
        w.grad = g2.clone()
        opt.step()
        ws.append(w.detach().clone())
    assert float(opt.state[w]["step"]) == WARM_START_STEP + 2
    assert not torch.allclose(ws[0], ws[1], rtol=1e-6, atol=0)


def test_svd_start_holds_a_constant_low_rank_gradient():
    g = _rank_one_positive(9, 11, 5)
    w = torch.nn.Parameter(torch.zeros_like(g))
    opt = LoRAPre([w], lr=1e-3, weight_decay=0.0, rank=2, init="svd")
    for _ in range(20):
        w.grad = g.clone()
        opt.step()
    m, v = opt.low_rank_moments(w)
    # the regression's fixed point, moved only by the ridge (1e-6 of the Gram's trace)
    torch.testing.assert_close(m, g, atol=1e-5 * float(g.abs().max()), rtol=0)
    torch.testing.assert_close(v, g.square(), atol=1e-5 * float(g.square().max()), rtol=0)


def test_svd_start_with_a_zero_first_gradient_stays_finite():
    g = torch.zeros(6, 5, dtype=F64)
    w, opt = _one_step("svd", g, rank=2)
    assert torch.count_nonzero(w) == 0
    w.grad = _rank_one_positive(6, 5, 6)
    opt.step()
    assert torch.isfinite(w).all() and torch.count_nonzero(w) > 0


def test_svd_start_keeps_float32_factors_for_bf16_weights():
    g = _rank_one_positive(8, 8, 7).to(torch.bfloat16)
    w = torch.nn.Parameter(torch.zeros_like(g))
    opt = LoRAPre([w], lr=1e-3, rank=2, init="svd")
    w.grad = g.clone()
    opt.step()
    assert all(opt.state[w][k].dtype == torch.float32 for k in ("m_B", "m_A", "v_B", "v_A"))


@pytest.mark.parametrize("bad", ["random", "", None])
def test_unknown_init_is_refused_before_any_work(bad):
    w = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(InvalidInputError, match="init"):
        LoRAPre([w], rank=2, init=bad)
    with pytest.raises(InvalidInputError, match="init"):
        LoRAPre([{"params": [w], "init": bad}], rank=2)


def test_init_round_trips_and_old_states_load_with_the_zero_start():
    g = _rank_one_positive(6, 6, 8).float()
    w, opt = _one_step("svd", g, rank=2)
    saved = opt.state_dict()
    fresh = LoRAPre([w], lr=0.1, weight_decay=0.0, rank=2)  # default init "zero"
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["init"] == "svd"
    old = {**saved, "param_groups": [{k: v for k, v in g_.items() if k != "init"} for g_ in saved["param_groups"]]}
    older = LoRAPre([w], lr=0.1, weight_decay=0.0, rank=2, init="svd")
    older.load_state_dict(old)  # a state saved before `init` existed was trained from the zero start
    assert older.param_groups[0]["init"] == "zero"
