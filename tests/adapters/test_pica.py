"""PiCa's invariants (method card pica.md): identity at init, updates confined to the principal input subspace,
full-rank equivalence with full fine-tuning under SGD, shared gradient = sum of projected layer gradients,
parameter count independent of depth."""

import copy

import pytest
import torch
from torch import nn

from rankwise.adapters import PicaConfig, add_adapter
from rankwise.adapters.pica import principal_projector
from rankwise.models import tiny_llama
from rounding import max_abs, network_tol

pytestmark = pytest.mark.method("pica")

TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]


def _ids(shape=(2, 10)):
    return torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(4))


def test_init_equals_base_exactly():
    base = tiny_llama()
    model = add_adapter(copy.deepcopy(base), PicaConfig(r=8, target_modules=TARGETS))
    ids = _ids()
    assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    assert all(torch.count_nonzero(p) == 0 for p in model.shared.params.values())


def test_projector_is_top_right_singular_subspace():
    w = torch.randn(48, 32, dtype=torch.float64)
    P = principal_projector(w, 5)
    torch.testing.assert_close(P @ P.T, torch.eye(5, dtype=torch.float64))
    # the captured energy ||W P^T||^2 equals the sum of the top-5 squared singular values
    s = torch.linalg.svdvals(w)
    torch.testing.assert_close((w @ P.T).pow(2).sum(), s[:5].pow(2).sum())


def test_updates_stay_in_principal_subspace_after_training():
    model = add_adapter(tiny_llama(), PicaConfig(r=6, target_modules=TARGETS))
    before = {n: layer.weight.detach().clone() for n, layer in model.adapted_layers()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    ids = _ids()
    for _ in range(4):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    model.merge()
    for name, layer in model.adapted_layers():
        P = layer.adapters["default"].P
        delta = layer.weight.detach() - before[name]
        assert delta.norm() > 0, name
        residual = delta - delta @ P.T @ P
        # float32: merging rounds W + delta entry-wise (<= eps * |W|) and P's rows are orthonormal to fp32 rounding of
        # inner products of P.size(1) terms; an update outside the subspace leaves an O(|delta|) residual
        bound = network_tol(torch.float32, 1.0, 1, P.size(1)) * (layer.weight.norm() + delta.norm())
        assert residual.norm() <= bound, name


def test_full_rank_sgd_step_equals_full_finetuning_step():
    """Square layer, no sharing, r = d_in, plain SGD: the PiCa step is the full-FT step (P orthogonal).

    In float64: the two steps are different products (G vs G P^T P), equal only up to rounding."""
    torch.manual_seed(0)
    layer = nn.Linear(16, 16).double()
    x, y = torch.randn(32, 16, dtype=torch.float64), torch.randn(32, 16, dtype=torch.float64)
    lr = 0.1
    full = copy.deepcopy(layer)
    nn.functional.mse_loss(full(x), y).backward()
    with torch.no_grad():
        expected = full.weight - lr * full.weight.grad
    holder = nn.Sequential(copy.deepcopy(layer))
    model = add_adapter(holder, PicaConfig(r=16, target_modules=["0"], share=False))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    model.merge()
    torch.testing.assert_close(model.model[0].weight.detach(), expected, rtol=0, atol=network_tol(torch.float64, max_abs(expected), 1, 32))


def test_shared_gradient_is_sum_of_projected_layer_gradients():
    # float64: autograd's M.grad and sum_i G_i P_i^T are different products of the same backward (in float32 they
    # differ by ~1e-4 relative on the small entries)
    base = tiny_llama(num_layers=3).double()
    model = add_adapter(base, PicaConfig(r=4, target_modules=["up_proj"]))
    layers = dict(model.adapted_layers())
    for layer in layers.values():
        layer.base_layer.weight.requires_grad_(True)  # to read each layer's full gradient G_i
    (M,) = model.shared.params.values()
    with torch.no_grad():
        M.normal_()  # away from zero so the gradient is generic
    ids = _ids()
    model(input_ids=ids, labels=ids).loss.backward()
    expected = sum(layer.base_layer.weight.grad @ layer.adapters["default"].P.T for layer in layers.values())
    torch.testing.assert_close(M.grad, expected, rtol=0, atol=network_tol(torch.float64, max_abs(expected), 3, base.config.hidden_size))


@pytest.mark.parametrize("num_layers", [1, 2, 4])
def test_parameter_count_is_sum_of_type_widths_independent_of_depth(num_layers):
    r = 3
    model = add_adapter(tiny_llama(num_layers=num_layers), PicaConfig(r=r, target_modules=TARGETS))
    # tiny_llama widths: q 64, k 32, v 32 (GQA), up 128, down 64
    assert model.count_parameters().trainable == r * (64 + 32 + 32 + 128 + 64)
    unshared = add_adapter(tiny_llama(num_layers=num_layers), PicaConfig(r=r, target_modules=TARGETS, share=False))
    assert unshared.count_parameters().trainable == num_layers * r * (64 + 32 + 32 + 128 + 64)


def test_random_subspace_is_orthonormal_and_seeded():
    a = add_adapter(tiny_llama(), PicaConfig(r=5, target_modules=["q_proj"], subspace="random", seed=1))
    b = add_adapter(tiny_llama(), PicaConfig(r=5, target_modules=["q_proj"], subspace="random", seed=1))
    for (name, x), y in zip(a.adapters_of("default").items(), b.adapters_of("default").values()):
        assert torch.equal(x.P, y.P), name
        # a float64 QR basis stored in float32: orthonormal to fp32 rounding of inner products of 64 terms
        torch.testing.assert_close(x.P @ x.P.T, torch.eye(5), atol=network_tol(torch.float32, 1.0, 1, x.P.size(1)), rtol=0)


@pytest.mark.parametrize("shape", [(48, 32), (32, 48), (40, 40)])
def test_top_singular_matches_full_svd(shape):
    from rankwise.adapters.spectral import top_singular

    w = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    u, s, vh = top_singular(w, 7)
    U, S, Vh = torch.linalg.svd(w, full_matrices=False)
    torch.testing.assert_close(s, S[:7])
    torch.testing.assert_close(vh.T @ vh, Vh[:7].T @ Vh[:7])  # same subspace (signs are arbitrary)
    torch.testing.assert_close(u @ torch.diag(s) @ vh, U[:, :7] @ torch.diag(S[:7]) @ Vh[:7])
    low = torch.zeros(6, 5, dtype=torch.float64)
    low[0, 0] = 1.0  # rank 1: the requested second singular value is zero -> full-SVD fallback stays correct
    u2, s2, vh2 = top_singular(low, 2)
    torch.testing.assert_close(u2 @ torch.diag(s2) @ vh2, low)
