"""LoRA-Pre (Muon): Newton-Schulz, the update rule, the AdamW path, checkpoints and bad input (see the method card)."""

import math

import pytest
import torch
from rounding import max_abs, network_tol
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError
from rankwise.optim import LoRAPre, LoRAPreMuon, low_rank_param_groups, newton_schulz5, optimizer_state_bytes

pytestmark = pytest.mark.method("lora-pre")


def _model(width: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, width), nn.LayerNorm(width), nn.Tanh(), nn.Linear(width, 6))


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt.zero_grad()
    nn.functional.mse_loss(model(torch.randn(8, 12, generator=gen)), torch.randn(8, 6, generator=gen)).backward()
    opt.step()


def _step_tol(w0: torch.Tensor, step: float, orthogonalised: torch.Tensor) -> float:
    """Rounding of a float32 step W0 - step * O, O = NS5(direction), computed in two arrangements (the optimizer's
    fused add vs the test's subtraction): a few ulps of |W0|, plus step times NS5's own rounding of a direction the
    two sides form in a different order (5 iterations of width-min(p, q) products)."""
    eps = torch.finfo(torch.float32).eps
    ns_rounding = network_tol(torch.float32, max_abs(orthogonalised), depth=5, width=min(orthogonalised.shape))
    return 8 * eps * max_abs(w0) + abs(step) * ns_rounding


def _scale(w: torch.Tensor) -> float:
    return max(1.0, w.shape[0] / w.shape[1]) ** 0.5


# ---- Newton-Schulz -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(16, 32), (32, 16)])
def test_newton_schulz_orthogonalises_and_keeps_singular_vectors(shape):
    m = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    o = newton_schulz5(m)
    assert o.shape == m.shape and o.dtype == m.dtype
    s = torch.linalg.svdvals(o)
    assert 0.6 <= float(s.min()) and float(s.max()) <= 1.3, s  # quintic NS oscillates around 1 by design
    assert float(torch.linalg.svdvals(m).max() / torch.linalg.svdvals(m).min()) > 4  # the input was not near-orthogonal
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    assert float(nn.functional.cosine_similarity((u @ vh).flatten(), o.flatten(), dim=0)) > 0.9


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_newton_schulz_is_the_quintic_applied_five_times_to_each_singular_value(shape):
    # NS acts on singular values one by one: NS(U diag(s) V^T) = U diag(f^5(s / ||s||)) V^T with
    # f(x) = 3.4445 x - 4.7750 x^3 + 2.0315 x^5. Spread-out singular values make the step count and coefficients show.
    gen = torch.Generator().manual_seed(8)
    k = min(shape)
    u = torch.linalg.qr(torch.randn(shape[0], k, generator=gen, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(shape[1], k, generator=gen, dtype=torch.float64)).Q
    s = torch.logspace(0, -2.5, k, dtype=torch.float64)
    x = s / (s.norm() + 1e-7)
    for _ in range(5):
        x = 3.4445 * x - 4.7750 * x**3 + 2.0315 * x**5
    out = newton_schulz5(u @ torch.diag(s) @ v.T)
    torch.testing.assert_close(out, u @ torch.diag(x) @ v.T, rtol=0, atol=1e-10)
    assert float(x.min()) > 0.6  # five steps lift even the smallest (3e-3 of the norm)


def test_newton_schulz_edge_cases():
    assert torch.equal(newton_schulz5(torch.zeros(4, 6)), torch.zeros(4, 6))  # the eps keeps zero at zero
    m = torch.randn(8, 12, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(newton_schulz5(m.to(torch.bfloat16)).float(), newton_schulz5(m), atol=0.05, rtol=0.05)
    assert newton_schulz5(m.to(torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(InvalidInputError, match="matrix"):
        newton_schulz5(torch.zeros(2, 3, 4))


# ---- the update rule -----------------------------------------------------------------------------------------------


def test_zero_momentum_steps_are_orthogonalised_gradients():
    # mu = 0: m_t = g_t exactly at every step, so W moves by -lr * scale * NS5(g_t). One tall and one wide matrix.
    gen = torch.Generator().manual_seed(2)
    weights = [nn.Parameter(torch.randn(12, 6, generator=gen)), nn.Parameter(torch.randn(5, 9, generator=gen))]
    opt = LoRAPreMuon(weights, lr=0.05, momentum=0.0, rank=3)
    for _ in range(3):
        before = [w.detach().clone() for w in weights]
        grads = [torch.randn(w.shape, generator=gen) for w in weights]
        for w, g in zip(weights, grads):
            w.grad = g.clone()
        opt.step()
        for w, w0, g in zip(weights, before, grads):
            ns = newton_schulz5(g)
            tol = _step_tol(w0, 0.05 * _scale(w), ns)
            torch.testing.assert_close(w.detach(), w0 - 0.05 * _scale(w) * ns, rtol=0, atol=tol)
    assert _scale(weights[0]) == math.sqrt(2) and _scale(weights[1]) == 1.0


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("updated", [False, True])
def test_second_step_blends_the_chosen_factors(nesterov, updated):
    # m_t = mu (m_B m_A) + g_t, with the factors from before this step's regression (default) or after it.
    gen = torch.Generator().manual_seed(3)
    w = nn.Parameter(torch.randn(10, 7, generator=gen))
    opt = LoRAPreMuon([w], lr=0.03, momentum=0.9, rank=2, weight_decay=0.1, nesterov=nesterov, use_updated_factors=updated)
    w.grad = torch.randn(10, 7, generator=gen)
    opt.step()
    g = torch.randn(10, 7, generator=gen)
    w.grad = g.clone()
    w0, old = w.detach().clone(), opt.low_rank_momentum(w)
    opt.step()
    m = 0.9 * (opt.low_rank_momentum(w) if updated else old) + g
    direction = g + 0.9 * m if nesterov else m
    ns = newton_schulz5(direction)
    expected = w0 * (1 - 0.03 * 0.1) - 0.03 * _scale(w) * ns
    tol = _step_tol(w0, 0.03 * _scale(w), ns)
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=tol)
    # the other reading gives a clearly different step (so this test can tell them apart)
    other = 0.9 * (old if updated else opt.low_rank_momentum(w)) + g
    assert 0.03 * _scale(w) * float((newton_schulz5(other) - ns).abs().max()) > 4 * tol


def test_full_rank_square_matrix_is_exact_muon():
    # At full rank with p = q both Newton steps are exact projections, so one regression maps the product X to
    # (1-gamma)^2 X + (1 - (1-gamma)^2) g/(1-mu) = mu X + g: Muon's momentum, which only holds with decay sqrt(mu).
    gen = torch.Generator().manual_seed(7)
    w = nn.Parameter(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    ref_w, ref_m = w.detach().clone(), torch.zeros(6, 6, dtype=torch.float64)
    opt = LoRAPreMuon([w], lr=0.02, momentum=0.95, rank=6, ridge=1e-12)  # float64, tiny ridge: near-exact solves
    for _ in range(10):
        g = torch.randn(6, 6, generator=gen, dtype=torch.float64)
        w.grad = g.clone()
        opt.step()
        ref_m = 0.95 * ref_m + g
        ref_w -= 0.02 * newton_schulz5(ref_m)
        # not 1e-12: the factors drift towards ill-conditioning, and the ridge then costs digits (1e-5 here)
        assert float((opt.low_rank_momentum(w) - ref_m).norm() / ref_m.norm()) < 1e-3
    torch.testing.assert_close(w.detach(), ref_w, rtol=0, atol=1e-4)


def test_constant_low_rank_gradient_is_learned_as_muon_momentum():
    # A constant gradient of rank 2 <= r: the factors converge to g / (1 - mu), Muon's steady momentum.
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(14, 2, generator=gen) @ torch.randn(2, 9, generator=gen)
    w = nn.Parameter(torch.zeros(14, 9))
    mu = 0.9
    opt = LoRAPreMuon([w], lr=1e-3, momentum=mu, rank=3)
    for _ in range(200):
        w.grad = g.clone()
        opt.step()
    target = g / (1 - mu)
    assert float((opt.low_rank_momentum(w) - target).norm() / target.norm()) < 1e-3
    m_t = mu * opt.low_rank_momentum(w) + g  # the momentum the next step will use
    assert float((m_t - target).norm() / target.norm()) < 1e-3
    w0 = w.detach().clone()
    w.grad = g.clone()
    opt.step()
    # algorithmic, not rounding: the held momentum is g / (1 - mu) only to the 1e-3 checked above, so the step
    # lr * NS5(.) (lr = 1e-3, NS5 entries O(1)) may differ by ~1e-6; far below the step itself (~1e-3)
    torch.testing.assert_close(w.detach(), w0 - 1e-3 * _scale(w) * newton_schulz5(target), rtol=0, atol=1e-6)


def test_state_is_two_factors():
    model = _model()
    opt = LoRAPreMuon(model.parameters(), rank=3)
    _step(model, opt, 0)
    w = model[0].weight  # [10, 12]
    assert set(opt.state[w]) == {"step", "m_B", "m_A"}
    assert opt.state[w]["m_B"].shape == (10, 3) and opt.state[w]["m_A"].shape == (3, 12)
    assert optimizer_state_bytes(opt, [w]) == (10 + 12) * 3 * 4 + 4  # factors + the step counter
    assert set(opt.state[model[0].bias]) == {"step", "exp_avg", "exp_avg_sq"}


# ---- the AdamW path ------------------------------------------------------------------------------------------------


def test_dense_parameters_match_torch_adamw_bit_for_bit():
    ref, ours = _model(), _model()
    adamw = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.1, foreach=False)
    muon = LoRAPreMuon(ours.parameters(), lr=3e-3, weight_decay=0.1, rank=None)
    for i in range(5):
        _step(ref, adamw, i)
        _step(ours, muon, i)
    for p, q in zip(ref.parameters(), ours.parameters()):
        assert torch.equal(p, q)


def test_bias_and_layernorm_in_low_rank_groups_match_adamw():
    # low_rank_param_groups puts the biases and the LayerNorm in a rank=None group; the matrices get Muon. Gradients
    # are fed by hand so the dense parameters see the same ones in both runs.
    ref, ours = _model(), _model()
    groups = low_rank_param_groups(ours, rank=2)
    groups[1].update(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.05)
    muon = LoRAPreMuon(groups, lr=0.02, rank=2)
    dense_ref = [p for n, p in ref.named_parameters() if not n.endswith("weight") or n.startswith("1.")]
    dense_ours = [p for n, p in ours.named_parameters() if not n.endswith("weight") or n.startswith("1.")]
    assert len(dense_ours) == 4 and {id(p) for p in dense_ours} == {id(p) for p in groups[1]["params"]}
    adamw = torch.optim.AdamW(dense_ref, lr=2e-3, betas=(0.8, 0.99), weight_decay=0.05, foreach=False)
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        for p, q in zip(ref.parameters(), ours.parameters()):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        adamw.step()
        muon.step()
    for p, q in zip(dense_ref, dense_ours):
        assert torch.equal(p, q)
    assert not torch.equal(ref[0].weight, ours[0].weight)  # the matrices took Muon steps


# ---- checkpoints and bad input -------------------------------------------------------------------------------------


# The weights_only round trip and bit-identical resume are tested for both variants in test_lora_pre_state.py.


def test_loading_a_mismatched_state_is_a_clear_error():
    model = _model(width=10)
    opt = LoRAPreMuon(model.parameters(), rank=3)
    _step(model, opt, 0)
    with pytest.raises(InvalidInputError, match="changed shape"):
        LoRAPreMuon(_model(width=9).parameters(), rank=3).load_state_dict(opt.state_dict())
    # a state of the Adam variant (other hyperparameters, other factors) is refused both ways
    adam = LoRAPre(model.parameters(), rank=3)
    _step(model, adam, 0)
    with pytest.raises(InvalidInputError, match="not saved by LoRAPreMuon"):
        LoRAPreMuon(model.parameters(), rank=3).load_state_dict(adam.state_dict())
    with pytest.raises(InvalidInputError, match="not saved by this optimizer"):
        LoRAPre(model.parameters(), rank=3).load_state_dict(opt.state_dict())


def test_bad_hyperparameters_are_refused():
    with pytest.raises(InvalidInputError, match="exceeds the smaller dimension"):
        LoRAPreMuon(_model().parameters(), rank=7)  # the last layer is [6, 10]
    with pytest.raises(InvalidInputError, match="rank must be"):
        LoRAPreMuon(_model().parameters(), rank=0)
    with pytest.raises(InvalidInputError, match="momentum"):
        LoRAPreMuon(_model().parameters(), momentum=1.0)
    with pytest.raises(InvalidInputError, match="betas"):
        LoRAPreMuon(_model().parameters(), betas=(0.9, 1.0))
    with pytest.raises(InvalidInputError, match="ns_steps"):
        LoRAPreMuon(_model().parameters(), ns_steps=0)
    with pytest.raises(InvalidInputError, match="nonfinite"):
        LoRAPreMuon(_model().parameters(), nonfinite="ignore")
    opt = LoRAPreMuon([_model()[0].weight], rank=2)
    with pytest.raises(InvalidInputError, match="exceeds"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(3, 8))], "rank": 4})
    assert len(opt.param_groups) == 1


def test_nonfinite_gradient_raises_or_skips():
    model = _model()
    opt = LoRAPreMuon(model.parameters(), rank=3)
    _step(model, opt, 0)
    before = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
    params = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[3].bias.grad[0] = math.nan
    with pytest.raises(NumericalError, match="LoRAPreMuon"):
        opt.step()
    opt.nonfinite = "skip"
    opt.step()
    assert opt.skipped_steps == 1
    for k, v in opt.state[model[0].weight].items():
        assert torch.equal(v, before[k]), k
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))


def test_bf16_weights_keep_float32_factors():
    w = nn.Parameter(torch.randn(8, 6).to(torch.bfloat16))
    opt = LoRAPreMuon([w], rank=2)
    w.grad = torch.randn(8, 6).to(torch.bfloat16)
    opt.step()
    assert w.dtype == torch.bfloat16 and opt.state[w]["m_B"].dtype == torch.float32 and torch.isfinite(w).all()


# ---- training ------------------------------------------------------------------------------------------------------


def test_trains_a_small_mlp():
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(64, 8, generator=gen)
    y = torch.tanh(x @ torch.randn(8, 4, generator=gen)) + 0.1 * x[:, :4]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    groups = low_rank_param_groups(model, rank=4)
    groups[1]["lr"] = 1e-2  # the biases: AdamW with an AdamW-sized lr
    opt = LoRAPreMuon(groups, lr=0.02, rank=4)
    losses = []
    for _ in range(50):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], (losses[0], losses[-1])
