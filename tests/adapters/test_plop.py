"""PLoP's invariants (method card plop.md): NFN ~ 1 for random W and inputs, scale invariance, aligned / null-space
inputs, determinism and hook removal, mean-of-ratios aggregation, target lists that peft accepts, padding masked."""

import copy

import pytest
import torch
from torch import nn

from rankwise.adapters import LoraConfig, add_adapter
from rankwise.adapters.plop import (
    kendall_tau, lora_parameters_per_rank, nfn, nfn_scores, nfn_scores_for_seeds, plop_targets, rank_for_budget, short_name, target_modules,
)
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_bert, tiny_llama
from rounding import network_tol

pytestmark = pytest.mark.method("plop")


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_random_weight_random_inputs_give_nfn_near_one():
    W, z = _randn(256, 256, seed=1), _randn(512, 256, seed=2)
    assert 0.95 <= nfn(W, z) <= 1.05


def test_scale_invariance():
    W, z = _randn(64, 96, seed=1), _randn(40, 96, seed=2)
    # float32 norms of 96-term rows: the scaled inputs round differently; not scale invariant would be O(1) off
    assert nfn(3.5 * W, 0.01 * z) == pytest.approx(nfn(W, z), rel=network_tol(torch.float32, 1.0, 1, 96))


def test_aligned_and_null_space_inputs():
    # A weight with a decaying spectrum: inputs on the top right singular vector are strongly aligned.
    U, _ = torch.linalg.qr(_randn(128, 128, seed=3))
    V, _ = torch.linalg.qr(_randn(128, 128, seed=4))
    s = torch.linspace(10, 0.1, 128)
    W = (U * s) @ V.T
    top = V[:, 0].repeat(64, 1) * torch.rand(64, 1, generator=torch.Generator().manual_seed(5)).add(0.5)
    expected = float(s[0] / s.pow(2).mean().sqrt())
    assert nfn(W, top) == pytest.approx(expected, rel=0.05)
    assert expected > 1
    W_deficient = W.clone()
    W_deficient -= torch.outer(W @ V[:, 0], V[:, 0])  # V[:, 0] is now in W's null space
    # W_deficient v is zero up to fp32 rounding of 128-term inner products, on the scale of the aligned NFN (1.7)
    assert nfn(W_deficient, V[:, 0].repeat(8, 1)) < network_tol(torch.float32, expected, 1, 128)


def _batches(n=2, shape=(3, 10)):
    return [torch.randint(0, 2000, shape, generator=torch.Generator().manual_seed(10 + i)) for i in range(n)]


def test_deterministic_and_hooks_removed():
    model = tiny_llama(vocab_size=2048, num_layers=3)
    a = nfn_scores(model, _batches(), seed=4)
    b = nfn_scores(model, _batches(), seed=4)
    assert a.per_module == b.per_module
    c = nfn_scores(model, _batches(), seed=5)
    assert c.per_module != a.per_module
    both = nfn_scores_for_seeds(model, _batches(), [4, 5])  # one forward pass, same numbers as separate runs
    assert both[4].per_module == a.per_module and both[5].per_module == c.per_module
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert len(a.per_type) == 7 and len(a.per_module) == 21


def test_type_score_is_mean_of_per_layer_ratios_and_subsets_match():
    model = tiny_llama(vocab_size=2048, num_layers=3)
    scores = nfn_scores(model, _batches(3), seed=0)
    for t, members in scores.type_members.items():
        assert scores.per_type[t] == pytest.approx(sum(scores.per_module[n] for n in members) / len(members))
        for n in members:
            assert scores.per_module[n] == pytest.approx(sum(scores.per_batch[n]) / 3)
    # a batch's scores do not depend on which other batches were scored
    alone = nfn_scores(model, _batches(3)[:1], seed=0)
    assert alone.per_module == pytest.approx(scores.subset([0]).per_module)


def test_padding_rows_are_masked():
    model = tiny_llama(vocab_size=2048, num_layers=2)
    ids = _batches(1, (2, 8))[0]
    padded = torch.cat([ids, torch.full((2, 5), 2)], dim=1)
    mask = torch.cat([torch.ones(2, 8, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long)], dim=1)
    plain = nfn_scores(model, [ids], seed=1)
    masked = nfn_scores(model, [{"input_ids": padded, "attention_mask": mask}], seed=1)
    # same real rows; only the random draw's shape differs, so compare loosely
    for n in plain.per_module:
        assert masked.per_module[n] == pytest.approx(plain.per_module[n], rel=0.15)


def test_selected_targets_plug_into_peft_with_analytic_parameter_count():
    peft = pytest.importorskip("peft")
    base = tiny_llama(vocab_size=2048, num_layers=2)
    scores = nfn_scores(base, _batches(), seed=0)
    for inverse in (False, True):
        targets = plop_targets(scores, k=3, inverse=inverse)
        assert len(targets) == 3 and all("." not in t for t in targets)  # Llama: short names
        theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, target_modules=targets))
        ours = add_adapter(copy.deepcopy(base), LoraConfig(r=4, target_modules=targets))
        analytic = 4 * lora_parameters_per_rank(base, targets)
        assert theirs.get_nb_trainable_parameters()[0] == analytic == ours.count_parameters().trainable
    assert rank_for_budget(base, ["q_proj"], 4 * lora_parameters_per_rank(base, ["q_proj"])) == 4


def test_bert_types_are_kept_apart_in_target_lists():
    peft = pytest.importorskip("peft")
    base = tiny_bert()
    scores = nfn_scores(base, _batches(1, (2, 8)), seed=0)
    assert len(scores.per_type) == 6
    ffn_out = "encoder.layer.*.output.dense"
    attn_out = "encoder.layer.*.attention.output.dense"
    assert short_name(ffn_out, scores.type_members) is None
    assert short_name(attn_out, scores.type_members) == "attention.output.dense"
    targets = target_modules(scores, [ffn_out])
    assert targets == ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=2, target_modules=targets))
    adapted = {n.split(".lora_A")[0].replace("base_model.model.", "") for n, _ in model.named_parameters() if "lora_A" in n}
    assert adapted == set(targets)


def test_kendall_tau_and_bad_input():
    assert kendall_tau(list("abcd"), list("abcd")) == 1.0
    assert kendall_tau(list("abcd"), list("dcba")) == -1.0
    with pytest.raises(InvalidInputError):
        kendall_tau(list("abc"), list("abd"))
    scores = nfn_scores(tiny_llama(vocab_size=2048, num_layers=1), _batches(1), seed=0)
    with pytest.raises(InvalidInputError):
        scores.lowest(8)
    with pytest.raises(InvalidInputError):
        nfn_scores(tiny_llama(vocab_size=2048, num_layers=1), [])
    with pytest.raises(InvalidInputError):
        nfn_scores(nn.Sequential(nn.Linear(4, 4)), [torch.zeros(1, 4)])
