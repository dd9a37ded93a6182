"""Fake quantization of models, packed storage (save / validated reload), and the three-term error model."""

import json

import pytest
import torch

from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.models import load_model, load_smollm2_tokenizer, tiny_llama
from rankwise.quant.block import get_recipe, global_scale_for
from rankwise.quant.error_model import gaussian_terms, monte_carlo_terms, predict_tensor
from rankwise.quant.fake_quant import fake_quantize, quantize_linears_, quantized_copy
from rankwise.quant.storage import save_quantized

pytestmark = pytest.mark.method("microscaling-ue5m3")


def test_quantize_linears_in_place_skips_lm_head_and_is_idempotent():
    model = tiny_llama(0)
    head = model.lm_head.weight.clone()
    q_proj = model.model.layers[0].self_attn.q_proj.weight.clone()
    stats = quantize_linears_(model, get_recipe("fp4-ue5m3"))
    assert "lm_head" not in stats and "model.layers.0.self_attn.q_proj" in stats
    assert torch.equal(model.lm_head.weight, head)
    w = model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(w, fake_quantize(q_proj, get_recipe("fp4-ue5m3")))
    assert torch.equal(fake_quantize(w, get_recipe("fp4-ue5m3")), w)  # a quantized weight is a fixed point
    assert all(0 < s.mse and 5 < s.sqnr_db < 40 for s in stats.values())


def test_activation_quantization_wraps_linears_and_changes_outputs():
    model = tiny_llama(0)
    ids = torch.randint(0, 1000, (1, 12))
    weights_only, _ = quantized_copy(model, get_recipe("fp4-ue5m3"))
    both, _ = quantized_copy(model, get_recipe("fp4-ue5m3"), activations=get_recipe("fp4-ue5m3"))
    assert type(both.model.layers[0].mlp.up_proj).__name__ == "FakeQuantLinear"
    a, b = weights_only(ids).logits, both(ids).logits
    assert torch.isfinite(b).all() and not torch.equal(a, b)
    # the original model is untouched
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear


def test_narrowing_alpha_is_the_identity_for_power_of_two_scales():
    # Quantizing 2^-j * W and dividing back is exactly W's quantization under E8M0 scales (the grid just shifts).
    model_a, model_b = tiny_llama(0), tiny_llama(0)
    quantize_linears_(model_a, get_recipe("mxfp4"))
    quantize_linears_(model_b, get_recipe("mxfp4"), scale_weights=2.0**-5)
    assert torch.equal(model_a.model.layers[1].mlp.down_proj.weight, model_b.model.layers[1].mlp.down_proj.weight)
    with pytest.raises(InvalidInputError):
        quantize_linears_(model_a, get_recipe("mxfp4"), scale_weights=0)


@pytest.mark.parametrize("name", ["fp4-ue5m3", "mxfp4", "mxfp8"])
def test_save_and_reload_equals_fake_quantization(tmp_path, name):
    model = tiny_llama(0, hidden_size=48)  # 48 is not a multiple of 32: exercises padding
    recipe = get_recipe(name)
    summary = save_quantized(model, load_smollm2_tokenizer(), recipe, tmp_path / "q")
    reloaded, tok = load_model(tmp_path / "q")
    expected, _ = quantized_copy(model, recipe)
    for (n, p), (_, e) in zip(reloaded.named_parameters(), expected.named_parameters()):
        assert torch.equal(p, e), n
    ids = torch.randint(0, 1000, (1, 10))
    assert torch.equal(reloaded(ids).logits, expected(ids).logits)
    assert tok is not None
    # measured payload = packed codes + one scale byte per (padded) block + one fp32 global scale per tensor
    k, expected_bytes, n = recipe.block_size, 0, 0
    for name_, lin in model.named_modules():
        if isinstance(lin, torch.nn.Linear) and name_ != "lm_head":
            rows, cols = lin.weight.shape
            blocks = -(-cols // k)
            expected_bytes += rows * (blocks * k * recipe.element.bits // 8 + blocks) + 4
            n += rows * cols
    assert summary.payload_bytes == expected_bytes and summary.quantized_weights == n
    assert summary.file_bytes > summary.payload_bytes


def test_reload_detects_corruption(tmp_path):
    model = tiny_llama(0)
    save_quantized(model, None, get_recipe("fp4-ue5m3"), tmp_path / "q")
    f = tmp_path / "q" / "quantized.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(CorruptFileError):
        load_model(tmp_path / "q")


def test_reload_refuses_a_newer_quantization_config(tmp_path):
    from rankwise.core.io import write_manifest

    save_quantized(tiny_llama(0), None, get_recipe("nvfp4"), tmp_path / "q")
    meta = json.loads((tmp_path / "q" / "quantization.json").read_text())
    meta["version"] = 99
    (tmp_path / "q" / "quantization.json").write_text(json.dumps(meta))
    write_manifest(tmp_path / "q")
    with pytest.raises(CorruptFileError, match="version"):
        load_model(tmp_path / "q")


@pytest.mark.parametrize("name", ["fp4-ue4m3", "fp4-ue5m3", "fp4-ue4m3-s", "mxfp4"])
@pytest.mark.parametrize("sigma", [0.1, 3e-3, 2e-4])
def test_error_model_matches_monte_carlo(name, sigma):
    recipe = get_recipe(name, 8)
    blocks = 2**15
    mc = monte_carlo_terms(sigma, recipe, blocks, seed=3)
    x = torch.randn(blocks, 8, generator=torch.Generator().manual_seed(3)) * sigma
    th = gaussian_terms(sigma, recipe, float(global_scale_for(x.abs().max(), recipe)))
    assert th.total == pytest.approx(mc.total, rel=0.03)
    for part in ("element", "max_element", "zero_block"):
        assert getattr(th, part) == pytest.approx(getattr(mc, part), rel=0.1, abs=0.01 * mc.total)


def test_error_model_regimes_follow_the_card():
    r8 = get_recipe("fp4-ue4m3", 8)
    wide, mid, narrow = gaussian_terms(0.05, r8), gaussian_terms(0.005, r8), gaussian_terms(5e-4, r8)
    assert wide.element > wide.max_element and wide.element > wide.zero_block
    assert narrow.zero_block > 0.9 * narrow.total
    # UE5M3 has no flush at sigma 5e-4 and no anomaly: block 8 beats block 16 there
    u8, u16 = gaussian_terms(5e-4, get_recipe("fp4-ue5m3", 8)), gaussian_terms(5e-4, get_recipe("fp4-ue5m3", 16))
    assert u8.zero_block == pytest.approx(0, abs=1e-20) and u8.total < u16.total
    assert gaussian_terms(0.005, get_recipe("fp4-ue4m3", 16)).total < mid.total  # the anomaly at sigma = 0.005


def test_predict_tensor_on_gaussian_rows_is_close():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, -1, 64, dtype=torch.float32).unsqueeze(1)
    p = predict_tensor(w, get_recipe("fp4-ue4m3", 16))
    assert p.ratio == pytest.approx(1.0, abs=0.1)
    with pytest.raises(InvalidInputError):
        predict_tensor(w.reshape(-1), get_recipe("fp4-ue4m3", 16))
