"""SVFT's invariants (the paper's SVD-based baseline of PiCa): zero init is the base model, the update is
U_r M Vh_r with M on the declared band only, the trainable count is r (2d + 1) - d (d + 1) per layer, forward and
merge agree, the PEFT form reproduces the delta, save/load round trips, bad options are refused."""

import copy

import pytest
import torch

from rankwise.adapters import add_adapter, load_adapter
from rankwise.adapters.svft import SvftConfig, banded_pattern, svft_parameter_count
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rounding import assert_rounding_close, product_tol

pytestmark = pytest.mark.method("pica")

TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]


def _ids(shape=(2, 10)):
    return torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(4))


def _perturb(model, seed=3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("off_diag", [0, 2])
def test_zero_init_is_the_base_model_exactly(off_diag):
    base = tiny_llama()
    model = add_adapter(copy.deepcopy(base), SvftConfig(r=16, off_diag=off_diag, target_modules=TARGETS))
    ids = _ids()
    assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    _perturb(model)
    assert (model(input_ids=ids).logits - base(input_ids=ids).logits).abs().max() > 1e-4


@pytest.mark.parametrize("r,d", [(16, 0), (16, 1), (16, 3), (5, 4)])
def test_band_pattern_and_trainable_count(r, d):
    rows, cols = banded_pattern(r, d)
    assert rows.numel() == svft_parameter_count(r, d) == len(set(zip(rows.tolist(), cols.tolist())))
    assert ((rows - cols).abs() <= d).all() and rows.min() >= 0 and cols.max() < r
    # every entry of the band is there: the count of a dense band by brute force
    assert rows.numel() == sum(1 for i in range(r) for j in range(r) if abs(i - j) <= d)
    base = tiny_llama()
    model = add_adapter(copy.deepcopy(base), SvftConfig(r=r, off_diag=d, target_modules=TARGETS))
    n_layers = len(list(model.adapted_layers()))
    assert model.count_parameters().trainable == n_layers * svft_parameter_count(r, d)


def test_update_is_u_m_vh_on_frozen_singular_vectors_and_forward_matches_merge():
    base = tiny_llama()
    model = add_adapter(copy.deepcopy(base), SvftConfig(r=12, off_diag=1, target_modules=TARGETS))
    _perturb(model)
    for name, layer in model.adapted_layers():
        a = layer.adapters["default"]
        w = layer.base_layer.weight.double()
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        # the frozen bases span W's top-12 singular subspaces (signs arbitrary): |<u_i, U_i>| = 1 up to U's rounding
        # to float32 (<= eps32 / 2; the float64 SVDs agree to eps64 / relative gap ~1e-13); another vector is O(1) off
        one = torch.ones(12, dtype=torch.float64)
        torch.testing.assert_close((u[:, :12] * a.U.double()).sum(0).abs(), one, atol=64 * torch.finfo(torch.float32).eps, rtol=0)
        torch.testing.assert_close((vh[:12] * a.Vh.double()).sum(1).abs(), one, atol=64 * torch.finfo(torch.float32).eps, rtol=0)
        m = a.dense_m()
        assert torch.count_nonzero(m[(torch.arange(12)[:, None] - torch.arange(12)[None, :]).abs() > 1]) == 0
        x = torch.randn(3, layer.in_features, dtype=torch.float64)
        # float64 reference of the adapter's forward, against the float32 output: within fp32's worst-case rounding
        ref = x @ (a.U.double() @ m.double() @ a.Vh.double()).T
        torch.testing.assert_close(a(x.float()).double(), ref, rtol=0, atol=product_tol(torch.float32, x, a.Vh.T, m.T, a.U.T))
        f = a.lora_factors()
        torch.testing.assert_close(f.scaling * f.B @ f.A, a.delta_weight())
    ids = _ids()
    out = model(input_ids=ids).logits
    model.merge()
    assert_rounding_close(model(input_ids=ids).logits, out, model)


def test_only_m_gets_gradients():
    model = add_adapter(tiny_llama(), SvftConfig(r=8, target_modules=TARGETS))
    model(input_ids=_ids()).logits.sum().backward()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(".m") for n in trainable)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_save_load_round_trip(tmp_path):
    base = tiny_llama()
    model = add_adapter(copy.deepcopy(base), SvftConfig(r=8, off_diag=1, target_modules=TARGETS))
    _perturb(model)
    ids = _ids()
    out = model(input_ids=ids).logits
    model.save(tmp_path / "svft")
    again = load_adapter(copy.deepcopy(base), tmp_path / "svft")
    assert torch.equal(again(input_ids=ids).logits, out)


@pytest.mark.parametrize("bad", [dict(off_diag=-1), dict(off_diag=8), dict(pattern="random"), dict(off_diag=1.5)])
def test_bad_options_are_refused(bad):
    with pytest.raises(InvalidInputError):
        add_adapter(tiny_llama(), SvftConfig(**{"r": 8, "target_modules": TARGETS, **bad}))
