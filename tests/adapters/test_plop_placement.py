"""The PLoP placement experiment's pieces: NFN restricted to the adaptable layers, the cached top-layers LM task
(restricted-vocabulary loss, frozen-prefix states), the topic windows, and one arm's training run."""

import pytest
import torch

from rankwise.adapters import AdaptedModel
from rankwise.adapters.plop import nfn_scores
from rankwise.data.windows import cut_windows
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama
from rankwise.repro.plop.arms import ArmRunner, Placement
from rankwise.training.frozen_prefix import FrozenPrefixRunner
from rankwise.training.top_layers_lm import CachedWindows, TopLayersLM

pytestmark = pytest.mark.method("plop")
VOCAB = 97


def _model():
    return tiny_llama(seed=0, vocab_size=VOCAB, num_layers=3).double()


def _ids(n, t, seed=0):
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def test_for_layers_averages_only_those_layers():
    model = _model()
    scores = nfn_scores(model, [_ids(4, 12)], seed=0)
    top = scores.for_layers([1, 2])
    for t, members in top.type_members.items():
        assert all(".layers.1." in n or ".layers.2." in n for n in members) and len(members) == 2
        assert top.per_type[t] == pytest.approx(sum(scores.per_module[n] for n in members) / 2, rel=1e-12)
    assert top.per_type != scores.per_type  # layer 0 is left out, so some type mean changes
    with pytest.raises(InvalidInputError):
        scores.for_layers([7])


def test_restricted_loss_is_the_renormalised_full_softmax_and_prefix_is_exact():
    model = _model()
    runner = FrozenPrefixRunner(model, start=1)
    w = _ids(3, 9, seed=1)
    vocab = torch.unique(w)
    index = TopLayersLM.token_index(vocab, VOCAB)
    assert torch.equal(index[vocab], torch.arange(vocab.numel())) and int((index >= 0).sum()) == vocab.numel()
    task = TopLayersLM(runner, vocab, model.lm_head.weight)
    data = CachedWindows(runner, w, index)
    with torch.no_grad():
        full = model(input_ids=w[:, :-1]).logits  # [B, T-1, V_full]
        # float64: the cached path is the same computation, so only rounding separates them
        assert torch.allclose(model.lm_head(runner.top(data.h)), full, rtol=0, atol=1e-9 * float(full.abs().max()))
        sub = full[..., vocab].log_softmax(-1)
        expected = -sub.gather(-1, index[w[:, 1:]].unsqueeze(-1)).mean()
        assert task.nll(data, batch_size=2) == pytest.approx(float(expected), rel=1e-9)
        assert float(task.loss(model, {"h": data.h, "targets": data.targets})) == pytest.approx(float(expected), rel=1e-9)
    # a target outside the vocabulary is refused before any work
    outside = w.clone()
    outside[0, -1] = int(torch.tensor([i for i in range(VOCAB) if i not in set(vocab.tolist())][0]))
    with pytest.raises(InvalidInputError):
        CachedWindows(runner, outside, index)


def test_windows_cut_a_stream_and_reject_bad_sizes():
    stream = torch.arange(10)
    assert cut_windows(stream, 3, 99).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert cut_windows(stream, 3, 2).shape == (2, 3)
    for args in ((1, 5), (3, 0), (11, 5)):
        with pytest.raises(InvalidInputError):
            cut_windows(stream, *args)


def test_an_arm_trains_only_its_targets_and_leaves_the_model_unchanged():
    model = tiny_llama(seed=0, vocab_size=VOCAB, num_layers=3)
    runner = FrozenPrefixRunner(model, start=2)
    w = _ids(8, 7, seed=2)
    vocab = torch.arange(VOCAB)
    index = TopLayersLM.token_index(vocab, VOCAB)
    task = TopLayersLM(runner, vocab, model.lm_head.weight)
    task.train_set, task.eval_set = CachedWindows(runner, w, index), CachedWindows(runner, _ids(2, 7, seed=3), index)
    test = CachedWindows(runner, _ids(2, 7, seed=4), index)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    base = task.nll(test)
    arms = ArmRunner(AdaptedModel(model), task, test, [2], steps=4, batch=4)
    result = arms.run(Placement("v", ("v_proj",), 2), lr=1e-2, seed=0)
    cfg = model.config
    kv = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert result.trainable == 2 * (cfg.hidden_size + kv)  # rank 2 on one layer's v_proj
    assert result.test_nll != base  # it trained
    assert set(model.state_dict()) == set(before) and all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert task.nll(test) == base  # the adapter is gone after the run
