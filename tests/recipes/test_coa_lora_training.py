"""CoA-LoRA's training machinery: storage formula, the quantized bank, the procedure (draws, accumulation, options)."""

import copy

import pytest
import torch
from torch.func import functional_call

from rankwise.adapters import add_adapter
from rankwise.adapters.coa_lora import CoaLoraConfig
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert
from rankwise.quant.codebook import fake_quantize_codebook, nf_levels
from rankwise.recipes.coa_lora import ConfigSpace, QuantizedBank, recipe_of, space_for

pytestmark = pytest.mark.method("coa-lora")
TARGETS = ["query", "value", "attention.output.dense", "output.dense"]
CHOICES = ((2, 4, 8), (4, 8), ("fp32",), (16, 32), (256,))


def _adapted():
    return add_adapter(tiny_bert(seed=0), CoaLoraConfig(r=4, target_modules=TARGETS))


def test_storage_formula_by_hand():
    space = ConfigSpace(("a", "b"), (100, 300), ((2, 4, 8), (8,), ("fp32", "bf16"), (16, 64), (256,)))
    a, b = (2, 8, "fp32", 64, 256), (4, 8, "bf16", 16, 256)
    assert space.average_bits((a, a)) == pytest.approx(2 + 8 / 64 + 32 / (64 * 256))
    assert space.average_bits((a, b)) == pytest.approx((100 * (2 + 8 / 64 + 32 / 16384) + 300 * (4 + 8 / 16 + 16 / 4096)) / 400)
    assert space.average_bits((b, b)) == pytest.approx(4.5 + 16 / 4096)


def test_bank_values_on_the_grid_idempotent_and_8_bit_far_better_than_2_bit():
    adapted = _adapted()
    space = space_for(adapted, CHOICES)
    bank = QuantizedBank(adapted, space)
    name = space.layers[0]
    w = bank.original[name]
    err = {}
    for option in [(2, 8, "fp32", 16, 256), (8, 8, "fp32", 16, 256)]:
        q = bank.weight(name, option)
        assert torch.equal(q, fake_quantize_codebook(w, recipe_of(option)))
        assert torch.equal(fake_quantize_codebook(q, recipe_of(option)), q)  # idempotent
        blocks = q.double().reshape(q.size(0), -1, 16)
        ratio = blocks / blocks.abs().amax(-1, keepdim=True)
        levels = nf_levels(option[0])
        # every value on the scaled codebook, up to the float32 rounding of level * scale, of the block maximum and
        # of the float32 levels (<= eps / 2 each, relative to |level| <= 1); the nearest other level is > 1e-3 away
        assert (ratio.unsqueeze(-1) - levels).abs().amin(-1).max() < 4 * torch.finfo(torch.float32).eps
        err[option[0]] = float((q - w).square().mean())
    assert err[8] < 1e-3 * err[2]


def test_bank_apply_restore_and_bad_configurations():
    adapted = _adapted()
    space = space_for(adapted, CHOICES)
    bank = QuantizedBank(adapted, space)
    layers = dict(bank.layers)
    config = space.uniform((2, 4, "fp32", 32, 256))
    bank.apply(config)
    first = space.layers[0]
    assert torch.equal(layers[first].base_layer.weight, bank.weight(first, config[0]))
    assert layers[first].adapters["default"].option == config[0]
    bank.restore()
    assert all(torch.equal(layers[n].base_layer.weight, bank.original[n]) for n in space.layers)
    with pytest.raises(InvalidInputError, match="one option per quantized layer"):
        bank.apply(config[:-1])
    with pytest.raises(InvalidInputError, match="B0=64"):
        bank.apply(space.uniform((2, 4, "fp32", 32, 256))[:-1] + ((2, 4, "fp32", 64, 256),))
    with pytest.raises(InvalidInputError, match="b0=3"):
        space.uniform((3, 4, "fp32", 32, 256))
    with pytest.raises(InvalidInputError, match="indices"):
        space.from_vector([9] * 5 * space.n_layers)


class _Task:
    """Mean squared projection of the encoder's output on a fixed direction, on fixed token ids (a stand-in task).

    Not the mean square of the output itself: BERT's last LayerNorm (weight 1, bias 0 at init) makes that a constant,
    1 - O(1e-12), whose gradients are rounding noise (~1e-10)."""

    direction = torch.randn(32, generator=torch.Generator().manual_seed(5))  # tiny_bert's hidden size

    def of_output(self, h):
        return (h @ self.direction.to(h.dtype)).pow(2).mean()

    def loss(self, module, batch):
        return self.of_output(module(input_ids=batch["ids"]).last_hidden_state)


def _procedure(adapted, **options):
    from rankwise.recipes.coa_lora.procedure import coa_lora_procedure

    base = {"bits": (2, 4, 8), "scale_bits": (4, 8), "blocks": (16, 32), "budgets": (2.5, 8.0, 0.5)}
    return coa_lora_procedure(adapted, _Task(), 3, **{**base, **options})


def test_draws_are_a_pure_function_of_seed_step_micro():
    adapted = _adapted()
    p = _procedure(adapted, search="random")
    q = _procedure(copy.deepcopy(adapted), search="random")
    assert [p.draw(s, m) for s in range(3) for m in range(2)] == [q.draw(s, m) for s in range(3) for m in range(2)]
    assert p.draw(0, 0) != p.draw(0, 1)


def test_accumulation_over_two_configurations_equals_the_summed_loss_gradient():
    # float64: the two sides sum the same per-configuration gradients in different orders
    adapted = add_adapter(tiny_bert(seed=0).double(), CoaLoraConfig(r=4, target_modules=TARGETS))
    with torch.no_grad():
        for p in adapted.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    proc = _procedure(adapted, search="random")
    ids = torch.randint(0, 1000, (2, 7), generator=torch.Generator().manual_seed(0))
    trainable = {n: p for n, p in adapted.named_parameters() if p.requires_grad}
    configs, bases = [], []
    for micro in range(2):  # exactly what train() does per micro-batch, with grad_accum = 2
        proc.before_micro_batch(0, micro)
        configs.append(proc.bank.current)
        bases.append({f"{n}.base_layer.weight": l.base_layer.weight.detach().clone() for n, l in proc.bank.layers.items()})
        (_Task().loss(adapted, {"ids": ids}) / 2).backward()
        if micro == 0:
            first = {n: p.grad.clone() for n, p in trainable.items()}
    assert configs[0] != configs[1]
    accumulated = {n: p.grad.clone() for n, p in trainable.items()}
    # the scale of each tensor's two contributions (their sum may cancel)
    scale = {n: float((first[n].abs() + (accumulated[n] - first[n]).abs()).max()) for n in trainable}
    assert all(v > 0 for v in scale.values())
    for p in trainable.values():
        p.grad = None
    names = list(proc.bank.layers)
    total = 0.0
    for config, weights in zip(configs, bases):  # both configurations' losses in one graph, each with its own base
        for n, layer in proc.bank.layers.items():  # U is computed from the knobs at forward time
            layer.adapters["default"].set_option(config[names.index(n)])
        total = total + _Task().of_output(functional_call(adapted, weights, kwargs={"input_ids": ids}).last_hidden_state)
    (total / 2).backward()
    for n, p in trainable.items():
        # float64 (eps 2.2e-16) through a 2-layer encoder: 1e-10 of the contributions' scale is rounding with a
        # wide margin, and far below what a dropped or mis-based configuration changes
        torch.testing.assert_close(p.grad, accumulated[n], rtol=0, atol=1e-10 * scale[n])


def test_search_keeps_a_segmented_front_and_deploys_within_budget():
    adapted = _adapted()
    proc = _procedure(adapted, search="pareto", search_every=1, deploy_bits=4.0)
    proc.after_step(0, adapted, _Task(), {"ids": torch.randint(0, 1000, (2, 7))})
    a = proc.search.archive
    assert len(a.vectors) > len(proc.pool) - 1 and all(v is not None for v in a.losses)
    from rankwise.algorithms.config_search import segmented_pareto

    keep = segmented_pareto(a.bits, a.losses)
    assert proc.search.training_set == [proc.space.from_vector(a.vectors[i]) for i in keep]
    proc.end_of_training(adapted)
    assert proc.space.average_bits(proc.bank.current) <= 4.0


@pytest.mark.parametrize("options, match", [
    ({"bogus": 1}, "no option"), ({"search": "grid"}, "search must be"), ({"search": "fixed"}, "fixed="),
    ({"bits": (2, 5)}, "bits"), ({"search_every": 0}, "search_every"), ({"budgets": (3, 2, 0.1)}, "budgets"),
    ({"budgets": (2.5, 7.3, 1e-6)}, "4,800,001 points; at most 1,000"), ({"bins": (2.25, 6.5, 1e-9)}, "at most 1,000"),
    ({"blocks": (128,)}, "not in the adapter's choices"),
])
def test_bad_procedure_options_are_refused_up_front(options, match):
    with pytest.raises(InvalidInputError, match=match):
        _procedure(_adapted(), **options)


def test_the_loop_refuses_checkpoints_with_this_procedure(tmp_path):
    from rankwise.training import TrainConfig, train

    adapted = _adapted()
    proc = _procedure(adapted, search="random")

    class T(_Task):
        name, metric, higher_is_better, num_train = "t", "loss", False, 4

        def batch(self, idx):
            return {"ids": torch.randint(0, 1000, (len(idx), 5), generator=torch.Generator().manual_seed(int(idx[0])))}

        def evaluate(self, module):
            return {"loss": 0.0}

    with pytest.raises(InvalidInputError, match="checkpoint"):
        train(adapted, T(), TrainConfig(steps=2, batch_size=2, checkpoint_every=1), out_dir=tmp_path, procedure=proc)
    res = train(adapted, T(), TrainConfig(steps=2, batch_size=2, grad_accum=2), procedure=proc)
    assert res.steps == 2 and len(proc.drawn) == 4
