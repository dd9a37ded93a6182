"""The harness with other optimizers: LoRA-Pre / GaLore factories, multi-group checkpoints and exact resume."""

import pytest
import torch

from rankwise.adapters import adapt
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.models import tiny_bert, tiny_llama
from rankwise.optim import LoRAPre, is_factored
from rankwise.training import LanguageModelingTask, TrainConfig, train
from rankwise.core.training.optimizer import adamw
from rankwise.optim.factories import galore, lora_pre
from rankwise.training.optimizers import optimizer_factory
from test_training import FailingTask, Interrupt, _cls_task


def _lm_task(n=24, t=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return LanguageModelingTask(torch.randint(0, 300, (n, t), generator=gen), torch.randint(0, 300, (4, t), generator=gen))


def _full_lm():
    return tiny_llama(seed=0, vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


class Recording:
    """Wraps a factory and keeps the optimizer it built, to inspect its state after training."""

    def __init__(self, factory):
        self.factory, self.built = factory, None

    def __call__(self, module, config):
        self.built = self.factory(module, config)
        return self.built


def test_lora_pre_full_fine_tuning_factors_only_block_matrices():
    model = _full_lm()
    factory = Recording(lora_pre(4))
    result = train(model, _lm_task(), TrainConfig(steps=12, batch_size=4, lr=1e-2), optimizer=factory)
    assert sum(result.losses[-3:]) < sum(result.losses[:3])
    opt = factory.built
    assert isinstance(opt, LoRAPre)
    factored = {n for n, p in model.named_parameters() for g in opt.param_groups if any(q is p for q in g["params"]) and is_factored(p, g)}
    assert "model.layers.0.mlp.up_proj.weight" in factored and "model.layers.0.self_attn.q_proj.weight" in factored
    assert not any("embed" in n or "norm" in n or "lm_head" in n for n in factored)
    assert opt.state[model.model.layers[0].mlp.down_proj.weight]["m_B"].shape == (32, 4)


def test_classifier_head_keeps_a_dense_state():
    task = _cls_task()
    clf = task.wrap(tiny_bert(vocab_size=1000))
    factory = Recording(lora_pre(2))
    train(clf, task, TrainConfig(steps=2, batch_size=4), optimizer=factory)
    assert "exp_avg" in factory.built.state[clf.head.weight]
    assert "m_B" in factory.built.state[clf.model.encoder.layer[0].attention.self.query.weight]


def test_resume_with_lora_pre_is_exact_and_other_optimizer_is_refused(tmp_path):
    config = TrainConfig(steps=6, batch_size=4, lr=1e-2, checkpoint_every=3, warmup_ratio=0.3)
    straight = _full_lm()
    ref = train(straight, _lm_task(), config, out_dir=tmp_path / "a", optimizer=lora_pre(4))
    with pytest.raises(Interrupt):
        train(_full_lm(), FailingTask(_lm_task(), at=5), config, out_dir=tmp_path / "b", optimizer=lora_pre(4))
    resumed_model = _full_lm()
    resumed = train(resumed_model, _lm_task(), config, out_dir=tmp_path / "b", optimizer=lora_pre(4))
    assert resumed.resumed_from == 3 and resumed.losses == ref.losses
    for (n, p), q in zip(straight.named_parameters(), resumed_model.parameters()):
        assert torch.equal(p, q), n
    for factory in (adamw(), lora_pre(2)):
        with pytest.raises(InvalidInputError, match="different settings.*optimizer"):
            train(_full_lm(), _lm_task(), config, out_dir=tmp_path / "b", optimizer=factory)


def test_groups_follow_the_schedule_at_their_own_learning_rate():
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.append([g["lr"] for g in self.param_groups])
            return super().step(closure)

    def make(module, config):
        emb = module.model.embed_tokens.weight
        rest = [p for p in module.parameters() if p is not emb]
        return Spy([{"params": [emb], "lr": config.lr / 10}, {"params": rest}], lr=config.lr)

    train(_full_lm(), _lm_task(), TrainConfig(steps=5, batch_size=4, lr=1e-2, warmup_ratio=0.4), optimizer=make)
    assert len(seen) == 5 and all(abs(a * 10 - b) < 1e-12 for a, b in seen)
    assert seen[0][1] < seen[1][1]  # warmup still applies


def test_bad_optimizer_choices_are_clear_errors(tmp_path):
    model = _full_lm()
    emb = model.model.embed_tokens.weight
    with pytest.raises(InvalidInputError, match="does not update 1 trainable parameter"):
        train(model, _lm_task(), TrainConfig(steps=1, batch_size=4),
              optimizer=lambda m, c: torch.optim.AdamW([p for p in m.parameters() if p is not emb]))
    torch.manual_seed(0)
    adapted = adapt(_full_lm(), "lora", 4, targets=["q_proj", "v_proj"])
    with pytest.raises(InvalidInputError, match="full fine-tuning"):
        train(adapted, _lm_task(), TrainConfig(steps=1, batch_size=4), optimizer=lora_pre(2))
    with pytest.raises(InvalidInputError, match="exceeds"):
        train(_full_lm(), _lm_task(), TrainConfig(steps=1, batch_size=4), optimizer=lora_pre(33))
    with pytest.raises(UnknownNameError, match="unknown optimizer"):
        optimizer_factory("sgd")
    with pytest.raises(InvalidInputError, match="needs a rank"):
        optimizer_factory("lora-pre")
    with pytest.raises(InvalidInputError, match="takes no rank"):
        optimizer_factory("adamw", rank=4)


def test_galore_trains_but_refuses_checkpoints(tmp_path):
    pytest.importorskip("galore_torch")
    result = train(_full_lm(), _lm_task(), TrainConfig(steps=3, batch_size=4), optimizer=galore(4, update_proj_gap=2))
    assert len(result.losses) == 3
    with pytest.raises(InvalidInputError, match="checkpoint_every=0"):
        train(_full_lm(), _lm_task(), TrainConfig(steps=2, batch_size=4, checkpoint_every=1), out_dir=tmp_path,
              optimizer=galore(4, update_proj_gap=2))
    assert not (tmp_path / "checkpoint").exists()
