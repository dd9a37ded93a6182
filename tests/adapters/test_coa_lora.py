"""CoA-LoRA adapter: U = 0 is plain LoRA, layer-wise independence of U, the PEFT export per configuration, bad input."""

import copy

import pytest
import torch

from rankwise.adapters import LoraConfig, add_adapter
from rankwise.adapters.coa_lora import CoaLoraAdapter, CoaLoraConfig
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert
from rounding import assert_rounding_close, product_tol

pytestmark = pytest.mark.method("coa-lora")
TARGETS = ["query", "value", "attention.output.dense", "output.dense"]


def _coa(model, **kw):
    return add_adapter(model, CoaLoraConfig(r=4, target_modules=TARGETS, **kw))


def _perturb(adapted, seed=3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapted.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


def _ids():
    return torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))


def test_zeroed_last_layer_equals_plain_lora():
    base = tiny_bert(seed=0)
    coa, lora = _coa(copy.deepcopy(base)), add_adapter(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=16.0, target_modules=TARGETS))
    _perturb(coa)
    lora_adapters = lora.adapters_of("default")
    with torch.no_grad():
        for name, a in coa.adapters_of("default").items():
            lora_adapters[name].A.copy_(a.A)
            lora_adapters[name].B.copy_(a.B)
        a0 = next(iter(coa.adapters_of("default").values()))
        a0.net_w2.zero_()
        a0.net_b2.zero_()
    ids = _ids()
    out_coa, out_lora = coa(input_ids=ids).last_hidden_state, lora(input_ids=ids).last_hidden_state
    assert torch.equal(out_coa, out_lora)  # U = 0 exactly: (I + 0) A x is A x bit for bit
    with torch.no_grad():
        a0.net_b2.fill_(0.1)  # and a nonzero U changes the output (the test can fail)
    assert (coa(input_ids=ids).last_hidden_state - out_lora).abs().max() > 1e-4


def test_adjustment_depends_only_on_its_own_layer():
    adapted = _coa(tiny_bert(seed=0))
    _perturb(adapted)
    adapters = list(adapted.adapters_of("default").values())
    before = [a.adjustment().detach().clone() for a in adapters]
    adapters[0].set_option((2, 2, "bf16", 64, 256))
    after = [a.adjustment().detach() for a in adapters]
    assert not torch.equal(after[0], before[0])
    for b, a in zip(before[1:], after[1:]):
        assert torch.equal(a, b)
    # and layers at different positions / kinds get different U under the same configuration
    assert not torch.equal(after[1], after[len(TARGETS) + 1])


def test_delta_weight_and_lora_factors_match_forward():
    adapted = _coa(tiny_bert(seed=0))
    _perturb(adapted)
    a = next(iter(adapted.adapters_of("default").values()))
    a.set_option((3, 4, "fp16", 32, 64))
    x = torch.randn(5, a.A.size(1), dtype=torch.float64)
    with torch.no_grad():
        f = a.lora_factors()
        expected = x @ a.delta_weight().double().T
        # two float32 evaluations of B (I + U) A x (the forward, and delta_weight inside `expected`): each within
        # the worst-case rounding of the chain; the factors' B (I + U) is delta_weight's, so only B @ A is re-rounded
        eye = torch.eye(a.r)
        tol = 2 * product_tol(torch.float32, x, a.A.T, (eye + a.adjustment().abs()).T, a.B.T) * a.scaling
        torch.testing.assert_close(a(x.float()).double(), expected, rtol=0, atol=tol)
        torch.testing.assert_close(x @ (f.B.double() @ f.A.double()).T * f.scaling, expected, rtol=0,
                                   atol=product_tol(torch.float32, x, f.A.T, f.B.T) * f.scaling)


def test_peft_loads_one_configuration_with_equal_outputs(tmp_path):
    peft = pytest.importorskip("peft")
    from rankwise.recipes.coa_lora import QuantizedBank, space_for
    from rankwise.recipes.coa_lora.deploy import export_configuration, quantized_base_weights, set_quantized_base

    base = tiny_bert(seed=0)
    adapted = _coa(copy.deepcopy(base), bits=[2, 4], scale_bits=[8], scale_dtypes=["fp32"], blocks=[16, 32], scale_blocks=[256])
    _perturb(adapted)
    space = space_for(adapted, ([2, 4], [8], ["fp32"], [16, 32], [256]))
    bank = QuantizedBank(adapted, space)
    config = tuple(space.options[i % len(space.options)] for i in range(space.n_layers))  # mixed per layer
    export_configuration(adapted, bank, config, tmp_path / "adapter")
    ids = _ids()
    ours = adapted(input_ids=ids).last_hidden_state
    qbase = set_quantized_base(copy.deepcopy(base), quantized_base_weights(bank, config, prefix="model."))
    loaded = peft.PeftModel.from_pretrained(qbase, tmp_path / "adapter")
    theirs = loaded(input_ids=ids).last_hidden_state
    assert_rounding_close(theirs, ours, adapted)
    bank.restore()  # the original base again: not the same model
    assert (adapted(input_ids=ids).last_hidden_state - theirs).abs().max() > 1e-3


def test_load_adapter_restores_the_configuration(tmp_path):
    from rankwise.adapters import load_adapter

    base = tiny_bert(seed=0)
    adapted = _coa(copy.deepcopy(base))
    _perturb(adapted)
    for a in adapted.adapters_of("default").values():
        a.set_option((2, 3, "bf16", 64, 16))
    adapted.save(tmp_path / "a")
    again = load_adapter(copy.deepcopy(base), tmp_path / "a")
    ids = _ids()
    torch.testing.assert_close(again(input_ids=ids).last_hidden_state, adapted(input_ids=ids).last_hidden_state, rtol=0, atol=0)
    assert all(a.option == (2, 3, "bf16", 64, 16) for a in again.adapters_of("default").values())


@pytest.mark.parametrize("bad, match", [
    (dict(bits=[2, 5]), "bits"), (dict(blocks=[48]), "blocks"), (dict(scale_dtypes=["fp8"]), "scale_dtypes"),
    (dict(bits=[]), "bits"), (dict(target_modules=".*query"), "module_kinds"),
])
def test_bad_config_is_refused(bad, match):
    kw = {"r": 4, "target_modules": TARGETS, **bad}
    with pytest.raises(InvalidInputError, match=match):
        CoaLoraConfig(**kw).validate()


def test_unsupported_layer_option_is_refused():
    adapted = _coa(tiny_bert(seed=0))
    a: CoaLoraAdapter = next(iter(adapted.adapters_of("default").values()))
    with pytest.raises(InvalidInputError, match="b0=5"):
        a.set_option((5, 8, "fp32", 16, 16))
    with pytest.raises(InvalidInputError, match="5 values"):
        a.set_option((4, 8, "fp32"))
