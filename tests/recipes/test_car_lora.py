"""CAR-LoRA: the card's invariants on a tiny Llama (identity-only = LoRA, quantized-forward gradients, pruning and
skipping masks on base and adapter, idempotent quantizers, θ₀ untouched), the operator draw, PEFT export, errors."""

import copy

import pytest
import torch
from torch import nn

from rankwise.adapters import LoraConfig, add_adapter
from rankwise.quant.compression_ops import get_operator, parse_operators
from rankwise.recipes.car_lora import CompressedBase
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.models import tiny_llama
from rankwise.training import TrainConfig, train
from rankwise.recipes.car_lora.procedure import CarLoraProcedure, car_lora_procedure, operator_index
from rankwise.training.tasks import LanguageModelingTask
from rounding import assert_rounding_close

pytestmark = pytest.mark.method("portable-adapter")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_OPS = "int8,int4,int3,nf4,fp4,mxfp4,prune,skip"


def _adapted(layers=3, seed=0, perturb=True):
    torch.manual_seed(seed)
    model = add_adapter(tiny_llama(seed=0, num_layers=layers, vocab_size=300), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS,
                                                                                          layers_to_transform=[1, 2]))
    if perturb:  # B = 0 at init would hide any bug that only shows with a nonzero adapter
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.1 * torch.randn_like(p))
    return model


def _ids(n=4, t=10, seed=1):
    return torch.randint(0, 300, (n, t), generator=torch.Generator().manual_seed(seed))


def _task():
    return LanguageModelingTask(_ids(16, 10, 2), _ids(4, 10, 3), name="toy")


def _lora_params(model):
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def test_identity_only_car_lora_is_plain_lora_step_for_step():
    config = TrainConfig(steps=4, batch_size=4, grad_accum=2, lr=1e-2, seed=3)
    plain_model, car_model = _adapted(), _adapted()
    plain = train(plain_model, _task(), config)
    car = train(car_model, _task(), config, procedure=car_lora_procedure(car_model, None, 3, operators="identity"))
    assert car.losses == plain.losses
    for (n, a), (_, b) in zip(_lora_params(plain_model).items(), _lora_params(car_model).items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("op", ["int8", "nf4", "fp4", "int3"])
def test_adapter_gradients_under_a_quantized_forward_treat_q_w0_as_a_constant(op):
    model = _adapted()
    base = CompressedBase(model, [op])
    ids = _ids()
    with base.using(op):
        model(input_ids=ids, labels=ids).loss.backward()
    ours = {n: p.grad.clone() for n, p in _lora_params(model).items()}
    # Reference: a copy whose base weights *are* Q(W0) (plain tensors), no switching machinery at all.
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    with torch.no_grad():
        for i in base.layers:
            for name, m in ref.model.model.layers[i].named_modules():
                if isinstance(m, nn.Linear) and "adapters" not in name:
                    rel = name.replace(".base_layer", "")
                    m.weight.copy_(get_operator(op).compress_weight(m.weight.float()))
                    assert torch.equal(m.weight, base.weight(op, i, rel))
    ref(input_ids=ids, labels=ids).loss.backward()
    # Bit for bit: the same modules run the same kernels on the same weights (the switch only swaps .data). A
    # rounding tolerance would not do: under int8 the gradients with W0 instead of Q(W0) differ by only ~3e-4.
    for n, p in _lora_params(ref).items():
        assert torch.equal(p.grad, ours[n]), n
    assert any(float(g.abs().max()) > 1e-4 for g in ours.values())


def test_pruned_channels_are_zero_in_base_and_adapter_and_get_no_gradient():
    model = _adapted()
    base = CompressedBase(model, ["prune"])
    captured = {}
    layer = model.model.model.layers[1]
    ids = _ids()
    with base.using("prune"):  # hooks registered after the operator's own, so they see the layers' final outputs
        hooks = [layer.mlp.up_proj.register_forward_hook(lambda m, i, o: captured.__setitem__("up", o)),
                 layer.mlp.gate_proj.register_forward_hook(lambda m, i, o: captured.__setitem__("gate", o))]
        model(input_ids=ids, labels=ids).loss.backward()
        for h in hooks:
            h.remove()
    keep = base.mask("prune", 1)
    pruned = keep == 0
    assert int(pruned.sum()) == round(0.25 * keep.numel())
    for key in ("up", "gate"):
        assert torch.all(captured[key][..., pruned] == 0)  # base and (nonzero) adapter: both masked
        assert float(captured[key][..., ~pruned].detach().abs().max()) > 0
    down = layer.mlp.down_proj.adapters["default"]
    assert torch.all(down.A.grad[:, pruned] == 0) and float(down.A.grad[:, ~pruned].abs().max()) > 0
    up = layer.mlp.up_proj.adapters["default"]
    assert torch.all(up.B.grad[pruned] == 0)  # nothing flows back through a pruned output either
    # the pruned channels are the lowest-norm rows of [gate, up]
    w = torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight], dim=1).norm(dim=1)
    assert float(w[pruned].max()) <= float(w[~pruned].min())


def test_a_skipped_block_is_the_identity_and_its_adapters_get_no_gradient():
    model = _adapted()
    base = CompressedBase(model, ["skip"], skip_layers=[1])
    block = model.model.model.layers[1]
    seen = {}
    pre = block.register_forward_pre_hook(lambda m, args, kwargs: seen.__setitem__("in", args[0] if args else kwargs["hidden_states"]),
                                          with_kwargs=True)
    post = block.register_forward_hook(lambda m, i, o: seen.__setitem__("out", o))
    ids = _ids()
    for _ in range(2):  # the first call learns the block's output type, the second does not run the block at all
        model.zero_grad(set_to_none=True)
        with base.using("skip"):
            model(input_ids=ids, labels=ids).loss.backward()
        assert torch.equal(seen["out"], seen["in"])
        for n, p in block.named_parameters():
            if p.requires_grad:
                assert p.grad is None or torch.all(p.grad == 0), n
        other = model.model.model.layers[2].self_attn.q_proj.adapters["default"]
        assert float(other.A.grad.abs().max()) > 0
    with torch.no_grad():  # restored: the block computes again
        model(input_ids=ids)
    pre.remove()
    post.remove()
    assert not torch.equal(seen["out"], seen["in"])


def test_quantizers_are_idempotent_and_int8_beats_int4_beats_int3():
    w = torch.randn(48, 160, generator=torch.Generator().manual_seed(0))
    errors = {}
    for name in ("int8", "int4", "int3", "nf4", "fp4", "mxfp4"):
        op = get_operator(name)
        q = op.compress_weight(w)
        assert torch.equal(op.compress_weight(q), q), name
        errors[name] = float((q - w).pow(2).mean())
    assert errors["int8"] < errors["int4"] < errors["int3"]


def test_training_over_every_operator_never_modifies_theta0_and_ends_on_it():
    model = _adapted()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    proc = car_lora_procedure(model, None, 0, operators=ALL_OPS)
    h = proc.base.original_hash()
    train(model, _task(), TrainConfig(steps=12, batch_size=4, grad_accum=2, lr=1e-2), procedure=proc)
    assert proc.base.original_hash() == h and proc.base.active == "identity"
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, before[n]), n
    assert sum(proc.counts.values()) == 24 and len([c for c in proc.counts.values() if c]) >= 5
    assert not any(b.__dict__.get("forward") for b in model.model.model.layers)  # no skip left behind


def test_the_operator_draw_is_uniform_and_a_pure_function_of_seed_step_micro():
    draws = [operator_index(5, step, micro, 5) for step in range(400) for micro in range(2)]
    assert draws == [operator_index(5, step, micro, 5) for step in range(400) for micro in range(2)]
    counts = torch.bincount(torch.tensor(draws), minlength=5)
    assert int(counts.min()) > 120  # 800 draws over 5: ~160 each
    assert draws != [operator_index(6, step, micro, 5) for step in range(400) for micro in range(2)]


def test_resume_repeats_the_uninterrupted_run(tmp_path):
    config = TrainConfig(steps=6, batch_size=4, lr=1e-2, checkpoint_every=3, seed=1)
    whole_model = _adapted()
    whole = train(whole_model, _task(), config, procedure=car_lora_procedure(whole_model, None, 1, operators=ALL_OPS))
    model = _adapted()
    train(model, _task(), config, out_dir=tmp_path, stop_after=3, procedure=car_lora_procedure(model, None, 1, operators=ALL_OPS))
    fresh = _adapted()
    resumed = train(fresh, _task(), config, out_dir=tmp_path, procedure=car_lora_procedure(fresh, None, 1, operators=ALL_OPS))
    assert resumed.losses == whole.losses
    for (n, a), (_, b) in zip(_lora_params(whole_model).items(), _lora_params(fresh).items()):
        assert torch.equal(a, b), n


def test_car_trained_adapter_loads_in_peft_with_equal_outputs_on_the_uncompressed_base(tmp_path):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base_model = tiny_llama(seed=0, num_layers=3, vocab_size=300)
    model = add_adapter(copy.deepcopy(base_model), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, layers_to_transform=[1, 2]))
    train(model, _task(), TrainConfig(steps=6, batch_size=4, lr=3e-2), procedure=car_lora_procedure(model, None, 0, operators=ALL_OPS))
    ids = _ids()
    expected = model(input_ids=ids).logits
    model.save(tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base_model), tmp_path / "adapter")
    assert_rounding_close(theirs(input_ids=ids).logits, expected, base_model)
    assert not torch.equal(expected, base_model(input_ids=ids).logits)  # it did train


@pytest.mark.parametrize("options, error, match", [
    ({"operators": "int8,zip"}, UnknownNameError, "unknown compression operator"),
    ({"operators": "nf5"}, InvalidInputError, "bits in"),
    ({"operators": "int8,int8"}, InvalidInputError, "twice"),
    ({"operators": ""}, InvalidInputError, "non-empty"),
    ({"operators": "prune1.5"}, UnknownNameError, "unknown compression operator"),
    ({"operators": "int8", "ratio": 0.3}, InvalidInputError, "no option"),
    ({"operators": "skip", "skip_layers": 0}, InvalidInputError, "among the compressed layers"),
    ({"operators": "int8", "layers": "a,b"}, InvalidInputError, "block indices"),
    ({"operators": "int8", "layers": [7]}, InvalidInputError, "not block indices"),
])
def test_bad_options_are_refused_before_training(options, error, match):
    with pytest.raises(error, match=match):
        car_lora_procedure(_adapted(perturb=False), None, 0, **options)


def test_a_model_without_adapters_or_blocks_is_refused():
    with pytest.raises(InvalidInputError, match="no block to compress"):
        CompressedBase(tiny_llama(seed=0, num_layers=2, vocab_size=300), parse_operators("int8"))
    with pytest.raises(InvalidInputError, match="block stack"):
        CompressedBase(nn.Sequential(nn.Linear(4, 4)), parse_operators("int8"), layers=[0])
    with pytest.raises(InvalidInputError, match="subset"):
        CarLoraProcedure(CompressedBase(_adapted(perturb=False), ["int8"]), ["nf4"], 0)
