"""CodeQuant's card invariants: folding + rotation keep the function, the Cayley R is orthogonal, clustered rows hold
at most k values, the centroid step is the mean gradient per cluster, Q_a is idempotent, k-means is a Lloyd fixed
point, GPTQ reduces to RTN under an identity Hessian and beats it on correlated inputs; bad input refused."""

from __future__ import annotations

import copy

import pytest
import torch

from rankwise.compress.codequant.accf import ACCFConfig
from rankwise.compress.codequant.act_quant import fake_quant, token_codes
from rankwise.compress.codequant.aos import AOSConfig, learn_rotation
from rankwise.compress.codequant.kmeans import assign, cluster_means, kmeans_rows
from rankwise.compress.codequant.layers import ClusteredLinear
from rankwise.compress.codequant.pipeline import QuantSpec, codequant_spec, quantize_, rotate_stage_, smooth_stage_
from rankwise.compress.codequant.rotate import random_orthogonal
from rankwise.compress.codequant.structure import decoder_of
from rankwise.compress.codequant.uniform import gptq, hessian, rtn
from rankwise.errors import InvalidInputError, NumericalError
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("codequant")
EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def model_and_ids():
    torch.manual_seed(0)
    return tiny_llama(vocab_size=300), torch.randint(0, 300, (4, 24))


def _logits(m, ids):
    with torch.no_grad():
        return m(ids).logits


@pytest.mark.parametrize("rotation", ["random", "learned"])
def test_fold_and_rotation_keep_the_function(model_and_ids, rotation):
    model, ids = model_and_ids
    ref = _logits(model, ids)
    m = copy.deepcopy(model)
    result = rotate_stage_(m, ids, QuantSpec(rotation=rotation, aos=AOSConfig(steps=3)))
    assert result.rotation is not None
    # fp32 chains of a 2-layer model: relative error a few hundred ulps at most (the card's 1e-4 in fp32)
    assert float((_logits(m, ids) - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
    norms = [b.input_norm.weight for b in decoder_of(m).blocks]
    assert all(torch.equal(w, torch.ones_like(w)) for w in norms)  # gains folded to 1
    assert m.lm_head.weight is not m.model.embed_tokens.weight  # untied before folding the final norm


def test_smoothquant_keeps_the_function(model_and_ids):
    model, ids = model_and_ids
    m = copy.deepcopy(model)
    rotate_stage_(m, ids, QuantSpec(rotation="none", weights="fp"))
    ref = _logits(m, ids)
    smooth_stage_(m, ids, 0.5)
    assert float((_logits(m, ids) - ref).abs().max()) <= 1e-4 * float(ref.abs().max())


def test_cayley_rotation_is_orthogonal_and_lowers_the_objective():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=g)
    x[:, 3] *= 30  # an outlier channel: the quantization error a rotation can spread
    res = learn_rotation([x], random_orthogonal(32, 0).float(), AOSConfig(steps=100, lr=1e-2, batch_tokens=256))
    r = res.rotation.double()
    assert float((r.T @ r - torch.eye(32, dtype=torch.float64)).abs().max()) < 1e-5
    assert res.final_loss < res.initial_loss


def test_act_quant_is_idempotent_and_fine_at_16_bits():
    x = torch.randn(7, 5, 64, generator=torch.Generator().manual_seed(1)) * 3
    once = fake_quant(x, 4)
    assert torch.equal(fake_quant(once, 4), once)
    codes, scale, lo = token_codes(x, 4)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert torch.allclose((codes.float() * scale + lo).squeeze(-2), once)
    assert float((fake_quant(x, 16) - x).abs().max()) < 1e-3
    grouped = fake_quant(x, 4, group=16)
    assert torch.equal(fake_quant(grouped, 4, group=16), grouped)


def test_act_quant_refuses_nan_and_bad_groups():
    x = torch.randn(3, 8)
    with pytest.raises(InvalidInputError):
        fake_quant(x, 4, group=3)
    with pytest.raises(InvalidInputError):
        fake_quant(x, 1)
    x[1, 2] = float("nan")
    with pytest.raises(NumericalError):
        token_codes(x, 4)


def test_kmeans_is_a_lloyd_fixed_point_and_exact_on_few_values():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(20, 300, generator=g, dtype=torch.float64)
    c, codes = kmeans_rows(v, 16)
    assert codes.dtype == torch.uint8 and int(codes.max()) < 16
    assert bool((c[:, 1:] >= c[:, :-1]).all())
    # every value sits with its nearest centroid ...
    nearest = (v[:, :, None] - c[:, None, :]).abs().argmin(-1)
    dist = (v - c.gather(1, codes.long())).abs()
    assert torch.allclose(dist, (v - c.gather(1, nearest)).abs())
    # ... and every non-empty centroid is its cluster's mean
    means, counts = cluster_means(v, codes.long(), 16)
    assert torch.allclose(c[counts > 0], means[counts > 0], atol=1e-6 * float(v.abs().max()))
    few = torch.randint(0, 10, (5, 100), generator=g).double() * 0.25
    c2, codes2 = kmeans_rows(few, 16)
    assert torch.equal(c2.gather(1, codes2.long()), few)  # <= 16 distinct values: reproduced exactly
    assert torch.equal(assign(few, c2).to(torch.uint8), codes2)


@pytest.mark.parametrize("group", [None, 16])
def test_clustered_rows_hold_at_most_k_values(group):
    w = torch.randn(12, 64, generator=torch.Generator().manual_seed(3))
    layer = ClusteredLinear.from_weight(w, None, k=16, group=group, act_bits=None)
    wc = layer.dequantized().detach()
    gs = 64 if group is None else group
    for row in wc.reshape(-1, gs):
        assert row.unique().numel() <= 16
    assert float((wc - w).pow(2).mean()) < float((rtn(w, 4, group) - w).pow(2).mean())  # k-means beats the grid in MSE


def test_centroid_gradient_divided_by_size_is_the_mean_gradient():
    w = torch.randn(6, 32, generator=torch.Generator().manual_seed(4))
    layer = ClusteredLinear.from_weight(w, None, k=16, group=16, act_bits=None)
    t = torch.randn(6, 32, generator=torch.Generator().manual_seed(5))
    (layer.dequantized() * t).sum().backward()  # dL/dW_c = t
    mean = layer.centroids.grad / layer.cluster_sizes().clamp_min(1)
    codes = layer.codes.view(6, 2, 16).long()
    expected = torch.zeros(6, 2, 16).scatter_add_(2, codes, t.view(6, 2, 16))
    expected = expected / torch.zeros(6, 2, 16).scatter_add_(2, codes, torch.ones(6, 2, 16)).clamp_min(1)
    assert torch.allclose(mean, expected, atol=64 * EPS32 * float(t.abs().max()))


def test_gptq_equals_rtn_under_identity_hessian_and_beats_it_on_correlated_inputs():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(16, 48, generator=g, dtype=torch.float64)
    eye = torch.eye(48, dtype=torch.float64)
    assert torch.allclose(gptq(w, eye, damp=1e-12).double(), rtn(w.float(), 4).double(), atol=1e-5)
    x = torch.randn(2000, 8, generator=g, dtype=torch.float64) @ torch.randn(8, 48, generator=g, dtype=torch.float64)
    x = x + 0.1 * torch.randn(2000, 48, generator=g, dtype=torch.float64)
    err = {name: float(((x @ (q.double() - w).T) ** 2).mean())
           for name, q in (("gptq", gptq(w, hessian(x))), ("rtn", rtn(w.float(), 4)))}
    assert err["gptq"] < err["rtn"]


def test_codequant_end_to_end_on_a_dense_model(model_and_ids):
    model, ids = model_and_ids
    m = copy.deepcopy(model)
    res = quantize_(m, ids, codequant_spec(aos=AOSConfig(steps=3), finetune=ACCFConfig(steps=2, lr=1.0)))
    names = {n for n, mod in m.named_modules() if isinstance(mod, ClusteredLinear)}
    assert names == set(res.quantized) and len(names) == 2 * 5  # q, k, v, gate, up per layer; o/down stay FP
    assert all(mod.source is None for mod in m.modules() if isinstance(mod, ClusteredLinear))
    assert torch.isfinite(_logits(m, ids)).all() and len(res.accf.losses) == 2


def test_bad_input_is_refused_before_work(model_and_ids):
    model, ids = model_and_ids
    with pytest.raises(InvalidInputError, match="bits"):
        QuantSpec(weight_bits=1)  # no codebook of 2 centroids below 2 bits
    with pytest.raises(InvalidInputError, match="fine-tuning needs"):
        QuantSpec(weights="rtn", finetune=ACCFConfig())
    m = copy.deepcopy(model)
    with pytest.raises(InvalidInputError, match="divisor"):
        quantize_(m, ids, QuantSpec(group=7))
    assert torch.equal(m.model.layers[0].input_layernorm.weight, model.model.layers[0].input_layernorm.weight)
    with pytest.raises(InvalidInputError, match="mixture-of-experts"):
        quantize_(copy.deepcopy(model), ids, codequant_spec(finetune=ACCFConfig(kl_weight=1.0)))
    with pytest.raises(InvalidInputError, match="int64"):
        quantize_(copy.deepcopy(model), ids.float(), QuantSpec())
    with pytest.raises(InvalidInputError, match="Llama-style"):
        decoder_of(torch.nn.Linear(3, 3))


@pytest.mark.parametrize("k", [16, 8])
def test_decode_path_through_the_lut_kernel_equals_the_reference(k):
    from rankwise.compress.codequant import lut

    if not lut.kernel_available():
        pytest.skip(f"LUT kernel unavailable: {lut.kernel_status()}")
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(7))
    layer = ClusteredLinear.from_weight(w, torch.randn(24), k=k, act_bits=4)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        fast = layer(x)  # 3 tokens: the kernel
        reference = torch.nn.functional.linear(fake_quant(x, 4).double(), layer.dequantized().double(), layer.bias.double())
    # fp32 accumulation of 64 products: within 64 ulps of the sum of magnitudes
    bound = 64 * EPS32 * (fake_quant(x, 4).abs() @ layer.dequantized().abs().T + layer.bias.abs()).double()
    assert bool(((fast.double() - reference).abs() <= bound + 1e-30).all())


def test_folder_reload_is_exact_and_detects_corruption(model_and_ids, tmp_path):
    from rankwise.compress.codequant import load_codequant, save_codequant
    from rankwise.errors import CorruptFileError

    model, ids = model_and_ids
    m = copy.deepcopy(model)
    spec = codequant_spec(aos=AOSConfig(steps=2), finetune=ACCFConfig(steps=1, lr=1.0))
    quantize_(m, ids, spec)
    summary = save_codequant(m, None, tmp_path / "cq", spec)
    assert summary.compression > 1 and summary.clustered_weights == 2 * (64 * (64 + 32 + 32) + 2 * 128 * 64)  # q, k, v, gate, up of 2 layers
    reloaded, _ = load_codequant(tmp_path / "cq")
    assert torch.equal(_logits(reloaded, ids), _logits(m, ids))  # the same modules, the same arithmetic
    f = tmp_path / "cq" / "clustered.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError):
        load_codequant(tmp_path / "cq")
