"""LoRA-Pre: checkpointing, resume, bad input, and the GaLore baseline's wiring."""

import copy
import io
import math

import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError
from rankwise.optim import LoRAPre, LoRAPreMuon, galore_adamw, low_rank_param_groups, optimizer_state_bytes

pytestmark = pytest.mark.method("lora-pre")


def _model(width: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, width), nn.Tanh(), nn.Linear(width, 6))


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt.zero_grad()
    nn.functional.mse_loss(model(torch.randn(8, 12, generator=gen)), torch.randn(8, 6, generator=gen)).backward()
    opt.step()


def _only_plain_values(obj) -> bool:
    """Values are tensors, numbers, bools, strings (option names) or None, in dicts keyed by str/int, lists and
    tuples: no pickled objects."""
    if isinstance(obj, dict):
        return all(isinstance(k, (str, int)) and _only_plain_values(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_only_plain_values(v) for v in obj)
    return obj is None or isinstance(obj, (torch.Tensor, int, float, bool, str))


VARIANTS = {  # (optimizer class, keyword arguments): both LoRA-Pre variants share the checkpoint contract
    "adam": (LoRAPre, dict(lr=1e-2, rank=3)),
    "muon": (LoRAPreMuon, dict(lr=0.02, rank=3, weight_decay=0.01)),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_state_dict_is_plain_and_resume_is_bit_identical(variant):
    cls, kwargs = VARIANTS[variant]
    model = _model()
    opt = cls(model.parameters(), **kwargs)
    for i in range(3):
        _step(model, opt, i)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    assert _only_plain_values(opt.state_dict())

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    resumed = _model()
    resumed.load_state_dict(ckpt["model"])
    resumed_opt = cls(resumed.parameters(), **kwargs, seed=123)  # the seed only matters for fresh states
    resumed_opt.load_state_dict(ckpt["opt"])
    for i in range(3, 6):
        _step(model, opt, i)
        _step(resumed, resumed_opt, i)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_loading_into_a_reshaped_model_is_a_clear_error():
    model = _model(width=10)
    opt = LoRAPre(model.parameters(), lr=1e-2, rank=3)
    _step(model, opt, 0)
    other = _model(width=9)
    with pytest.raises(InvalidInputError, match="changed shape"):
        LoRAPre(other.parameters(), lr=1e-2, rank=3).load_state_dict(opt.state_dict())
    with pytest.raises(InvalidInputError, match="parameter groups"):
        LoRAPre([{"params": [model[0].weight]}, {"params": [model[2].weight]}], rank=3).load_state_dict(opt.state_dict())
    with pytest.raises(InvalidInputError, match="model changed"):
        LoRAPre(list(model.parameters())[:2], rank=3).load_state_dict(opt.state_dict())


def test_rank_larger_than_a_matrix_dimension_is_refused():
    with pytest.raises(InvalidInputError, match="exceeds the smaller dimension"):
        LoRAPre(_model().parameters(), rank=7)  # the last layer is [6, 10]
    with pytest.raises(InvalidInputError, match="rank must be"):
        LoRAPre(_model().parameters(), rank=0)
    opt = LoRAPre([_model()[0].weight], rank=2)
    with pytest.raises(InvalidInputError, match="exceeds"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 8))], "rank": 4})
    assert len(opt.param_groups) == 1
    with pytest.raises(InvalidInputError, match="exceeds"):
        galore_adamw(_model(), lr=1e-3, rank=11)
    with pytest.raises(InvalidInputError):
        LoRAPre(_model().parameters(), betas=(0.9, 1.0))
    with pytest.raises(InvalidInputError):
        LoRAPre(_model().parameters(), nonfinite="ignore")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_gradient_raises_without_touching_state(bad):
    model = _model()
    opt = LoRAPre(model.parameters(), lr=1e-2, rank=3)
    _step(model, opt, 0)
    before = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
    params = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[2].bias.grad[0] = bad
    with pytest.raises(NumericalError, match="NaN or Inf"):
        opt.step()
    for k, v in opt.state[model[0].weight].items():
        assert torch.equal(v, before[k]), k
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))


def test_nonfinite_gradient_skip_policy_skips_the_whole_step():
    model = _model()
    opt = LoRAPre(model.parameters(), lr=1e-2, rank=3, nonfinite="skip")
    _step(model, opt, 0)
    saved = opt.state_dict()
    saved = {"state": {k: {n: t.clone() for n, t in v.items()} for k, v in saved["state"].items()}}
    params = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    opt.step()
    assert opt.skipped_steps == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    for k, entry in opt.state_dict()["state"].items():
        for n, t in entry.items():
            assert torch.equal(t, saved["state"][k][n])
    _step(model, opt, 1)  # training goes on afterwards
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_param_groups_keep_embeddings_and_head_dense():
    from rankwise.models import tiny_llama

    model = tiny_llama(0, vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=24)
    groups = low_rank_param_groups(model, rank=4)
    low = {id(p) for p in groups[0]["params"]}
    assert id(model.model.embed_tokens.weight) not in low and groups[1]["rank"] is None
    assert id(model.model.layers[0].mlp.up_proj.weight) in low
    assert len(low) == 7  # q, k, v, o, gate, up, down


def test_galore_baseline_applies_the_projected_adam_update():
    # At step 1 Adam's normalised update is R / (|R| + eps') with R = P^T g (P: top-r left singular vectors of g for a
    # wide matrix); GaLore applies -lr * scale * P (that). galore-torch adds eps before the bias correction, so
    # eps' = eps / sqrt(1 - beta2). Checks that our wiring hands galore-torch the right groups.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 5, bias=False))  # weight [5, 12]: wide, projected from the left
    w0 = model[0].weight.detach().clone()
    opt = galore_adamw(model, lr=1e-2, rank=2, update_proj_gap=10, scale=0.25)
    g = torch.randn(5, 12)
    model[0].weight.grad = g.clone()
    opt.step()
    p = torch.linalg.svd(g, full_matrices=False).U[:, :2]
    r = p.T @ g
    expected = w0 - 1e-2 * 0.25 * (p @ (r / (r.abs() + 1e-8 / 0.001**0.5)))
    torch.testing.assert_close(model[0].weight.detach(), expected, rtol=1e-5, atol=1e-6)
    assert optimizer_state_bytes(opt) == (5 * 2 + 2 * 2 * 12) * 4  # projector + two rank-2 moments


def test_a_state_saved_before_v_bias_correction_existed_resumes_with_adams_correction():
    model = _model()
    opt = LoRAPre(model.parameters(), lr=1e-2, rank=3, v_bias_correction="adam")
    for i in range(3):
        _step(model, opt, i)
    old = copy.deepcopy(opt.state_dict())  # a state dict shares its tensors with the live optimizer
    for group in old["param_groups"]:
        del group["v_bias_correction"]  # as written by the first release
    resumed = _model()
    resumed.load_state_dict(model.state_dict())
    resumed_opt = LoRAPre(resumed.parameters(), lr=1e-2, rank=3)  # today's default is "surrogate"
    resumed_opt.load_state_dict(old)
    assert all(g["v_bias_correction"] == "adam" for g in resumed_opt.param_groups)
    for i in range(3, 5):
        _step(model, opt, i)
        _step(resumed, resumed_opt, i)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_a_state_loads_twice_into_the_same_optimizer():
    """torch adds its own bookkeeping keys ('differentiable', ...) to `defaults` on the first load; the second load
    of the same state was refused as 'not saved by LoRAPre'."""
    from rankwise.optim import LoRAPre

    w = torch.nn.Parameter(torch.randn(8, 6, generator=torch.Generator().manual_seed(0)))
    opt = LoRAPre([w], rank=2, lr=1e-3)
    w.grad = torch.ones(8, 6)
    opt.step()
    saved = opt.state_dict()
    again = LoRAPre([w], rank=2, lr=1e-3)
    again.load_state_dict(saved)
    again.load_state_dict(saved)
    assert torch.equal(again.state[w]["m_A"], opt.state[w]["m_A"])
