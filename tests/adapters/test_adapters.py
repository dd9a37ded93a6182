"""Adapter core invariants on tiny models: injection, several adapters, disable/delete, merge, counts, bad input.

The matrix runs every invariant for every registered adapter type (the registry records' `adapters`), each with
its defaults and, where it has them, a variant; a type that needs calibration statistics gets them from random ids.
`test_the_matrix_covers_every_registered_adapter_type` fails when a record adds a type the matrix lacks.
"""

import copy

import pytest
import torch

from rankwise.adapters import (
    ADAPTER_TYPES,
    AdaptedLinear,
    GuardSpaceConfig,
    LoraConfig,
    PicaConfig,
    add_adapter,
    adapter_type,
    find_targets,
    layer_index,
    module_type,
)
from rankwise.adapters.coa_lora import CoaLoraConfig
from rankwise.adapters.svft import SvftConfig
from rankwise.core.calibration import collect_second_moments
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.models import tiny_bert, tiny_llama
from rounding import assert_rounding_close, logits_tol

CONFIGS = {
    "lora": lambda **kw: LoraConfig(lora_alpha=16, **kw),
    "lora-pissa": lambda **kw: LoraConfig(lora_alpha=16, init="pissa", **kw),
    "pica": lambda **kw: PicaConfig(**kw),
    "pica-unshared-random": lambda **kw: PicaConfig(share=False, subspace="random", **kw),
    "svft": lambda **kw: SvftConfig(**kw),
    "svft-banded": lambda **kw: SvftConfig(off_diag=1, **kw),
    "guardspace": lambda **kw: GuardSpaceConfig(**kw),
    "coa-lora": lambda **kw: CoaLoraConfig(**kw),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]


def _ids(seed=1, shape=(2, 12)):
    return torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(seed))


def _perturb(model, seed=3):
    """Give every trainable adapter parameter a random non-zero value (as training would)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


@pytest.fixture
def llama():
    return tiny_llama(seed=0)


def _adapt(kind, model, **kw):
    """add_adapter with CONFIGS[kind]; a type that builds from input statistics gets them from random ids."""
    config = CONFIGS[kind](**kw)
    statistics = None
    if adapter_type(config.method).needs_statistics:
        batches = [_ids(seed=10, shape=(2, 8))]  # 16 tokens: a protected span narrower than the width, as GuardSpace needs
        statistics = collect_second_moments(model, find_targets(model, config), batches, use_cache=False)
    return add_adapter(model, config, statistics=statistics)


def test_the_matrix_covers_every_registered_adapter_type():
    assert {CONFIGS[k]().method for k in CONFIGS} == set(ADAPTER_TYPES)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_init_is_identity_and_disable_is_exact(kind, llama):
    base = copy.deepcopy(llama)
    ids = _ids()
    ref = base(input_ids=ids).logits
    model = _adapt(kind, llama, r=4, target_modules=TARGETS)
    # PiSSA / PiCa rewrite W at init: equal to the base up to rounding, not bit for bit
    assert_rounding_close(model(input_ids=ids).logits, ref, base)
    _perturb(model)
    assert (model(input_ids=ids).logits - ref).abs().max() > 100 * logits_tol(base, ref)  # the check above can fail
    with model.adapters_disabled():
        assert torch.equal(model(input_ids=ids).logits, ref)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_merge_unmerge_exact_and_idempotent(kind, llama):
    model = _adapt(kind, llama, r=4, target_modules=TARGETS)
    _perturb(model)
    ids = _ids()
    unmerged = model(input_ids=ids).logits
    weights = {n: layer.weight.detach().clone() for n, layer in model.adapted_layers()}
    model.merge()
    merged = model(input_ids=ids).logits
    model.merge()  # idempotent
    torch.testing.assert_close(model(input_ids=ids).logits, merged, rtol=0, atol=0)
    assert_rounding_close(merged, unmerged, model)  # W + BA vs W x + B(A x): the same product, another order
    with model.adapters_disabled():  # the merged delta is bypassed too
        with torch.no_grad():
            disabled = model(input_ids=ids).logits
    model.unmerge()
    model.unmerge()
    for n, layer in model.adapted_layers():
        assert torch.equal(layer.weight, weights[n]), n  # bit-exact restore
    assert torch.equal(model(input_ids=ids).logits, unmerged)
    with model.adapters_disabled():
        assert torch.equal(model(input_ids=ids).logits, disabled)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_merge_and_unload_gives_plain_linear(kind, llama):
    model = _adapt(kind, llama, r=4, target_modules=TARGETS)
    _perturb(model)
    ids = _ids()
    expected = model(input_ids=ids).logits
    plain = model.merge_and_unload()
    assert not any(isinstance(m, AdaptedLinear) for m in plain.modules())
    assert_rounding_close(plain(input_ids=ids).logits, expected, plain)


def test_several_adapters_set_delete(llama):
    base = copy.deepcopy(llama)
    ids = _ids()
    model = add_adapter(llama, LoraConfig(r=2, target_modules=["q_proj"]), "a")
    _perturb(model, seed=1)
    out_a = model(input_ids=ids).logits
    model.add_adapter("b", PicaConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert model.active_adapters == ("b",)
    # only the active adapter trains
    a_params = [p for a in model.adapters_of("a").values() for p in a.parameters()]
    assert a_params and not any(p.requires_grad for p in a_params)
    _perturb(model, seed=2)
    out_b = model(input_ids=ids).logits
    model.set_adapter(["a", "b"])
    both = model(input_ids=ids).logits
    model.set_adapter("a")
    torch.testing.assert_close(model(input_ids=ids).logits, out_a, rtol=0, atol=0)
    model.merge()
    model.delete_adapter("a")  # deleting a merged adapter unmerges it
    model.set_adapter("b")
    torch.testing.assert_close(model(input_ids=ids).logits, out_b, rtol=0, atol=0)
    assert not torch.allclose(both, out_b)
    model.delete_adapter("b")
    assert not any(isinstance(m, AdaptedLinear) for m in model.model.modules())
    assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    with pytest.raises(UnknownNameError, match="no adapter named 'b'"):
        model.set_adapter("b")


def test_targets_names_regex_and_layers():
    model = tiny_llama(num_layers=3)
    names = find_targets(model, LoraConfig(target_modules=["q_proj", "mlp.up_proj"]))
    assert names == [f"model.layers.{i}.{m}" for i in range(3) for m in ("self_attn.q_proj", "mlp.up_proj")]
    regex = find_targets(model, LoraConfig(target_modules=r".*\.1\.self_attn\.(k|v)_proj"))
    assert regex == ["model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"]
    top = find_targets(model, LoraConfig(target_modules=["q_proj"], layers_to_transform=[2]))
    assert top == ["model.layers.2.self_attn.q_proj"]
    assert layer_index("encoder.layer.5.attention.output.dense") == 5
    # module types keep BERT's two "output.dense" apart
    bert = [module_type(n) for n in find_targets(tiny_bert(), LoraConfig(target_modules=["output.dense"]))]
    assert sorted(set(bert)) == ["encoder.layer.*.attention.output.dense", "encoder.layer.*.output.dense"]


def test_trainable_counts(llama):
    model = add_adapter(llama, LoraConfig(r=3, target_modules=["q_proj", "k_proj"]))
    # tiny_llama: hidden 64, q 64->64, k 64->32 (GQA), 2 layers
    assert model.count_parameters().trainable == 2 * (3 * (64 + 64) + 3 * (64 + 32))
    assert model.count_parameters().total == sum(p.numel() for p in tiny_llama().parameters()) + model.count_parameters().trainable


def test_no_match_and_bad_rank_leave_model_unchanged(llama):
    before = {n: type(m) for n, m in llama.named_modules()}
    with pytest.raises(InvalidInputError, match="no nn.Linear module matched .*q_proj"):
        add_adapter(llama, LoraConfig(target_modules=["query"]))
    with pytest.raises(InvalidInputError, match=r"rank r=40 exceeds min\(in, out\)=32 of model.layers.0.self_attn.k_proj"):
        add_adapter(llama, PicaConfig(r=40, target_modules=["q_proj", "k_proj"]))
    with pytest.raises(InvalidInputError, match="no nn.Linear module matched .* within layers"):
        add_adapter(llama, LoraConfig(target_modules=["q_proj"], layers_to_transform=[7]))
    assert {n: type(m) for n, m in llama.named_modules()} == before
    assert all(p.requires_grad for p in llama.parameters())
    with pytest.raises(InvalidInputError, match="positive integer"):
        add_adapter(llama, LoraConfig(r=0))
    with pytest.raises(InvalidInputError, match="identifier"):
        add_adapter(llama, LoraConfig(), adapter_name="bad.name")


def test_unknown_config_keys_warn_then_ignored():
    with pytest.warns(UserWarning, match=r"ignoring unknown config key\(s\) \['from_the_future'\]"):
        config = PicaConfig.from_dict({"method": "pica", "r": 5, "target_modules": ["q_proj"], "from_the_future": 1})
    assert config.r == 5 and config.share


def test_gradients_reach_only_adapter_parameters(llama):
    model = add_adapter(llama, LoraConfig(r=2, target_modules=TARGETS))
    model.model.train()
    ids = _ids()
    model(input_ids=ids, labels=ids).loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for p in trainable)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_adapter_type_table_is_consistent_and_unknown_names_are_listed():
    from rankwise.adapters import ADAPTER_TYPES, adapter_type, available_methods

    assert set(ADAPTER_TYPES) >= {"lora", "pica", "guardspace"} and available_methods() == sorted(ADAPTER_TYPES)
    for name, cls in ADAPTER_TYPES.items():
        assert cls.method == name and cls.config_class.method == name, name
        assert adapter_type(name) is cls
    with pytest.raises(UnknownNameError, match="guardspace"):
        adapter_type("dora")
