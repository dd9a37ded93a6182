"""The fine-tuning harness on tiny models: schedule, batching, exact resume, NaN stop, accumulation, tasks."""

import json
import math

import pytest
import torch

from rankwise.adapters import adapt, top_layers
from rankwise.errors import InvalidInputError, NumericalError
from rankwise.models import tiny_bert, tiny_llama
from rankwise.training import (
    ClassificationTask,
    LanguageModelingTask,
    TrainConfig,
    batch_indices,
    lr_at,
    train,
)
from rounding import assert_rounding_close

EPS32 = torch.finfo(torch.float32).eps


class WordTokenizer:
    """A deterministic stand-in tokenizer: one id per word (hashed into a small vocabulary)."""

    pad_token_id, eos_token_id = 0, 0

    def __call__(self, texts, truncation=True, max_length=None):
        ids = [[1 + sum(map(ord, w)) % 900 for w in t.split()][:max_length] for t in texts]
        return {"input_ids": ids}


def _lm_task(n=24, t=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return LanguageModelingTask(torch.randint(0, 900, (n, t), generator=gen), torch.randint(0, 900, (4, t), generator=gen))


def _cls_task(n=40):
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    texts = [" ".join(words[(i * k) % 6] for k in range(1, 3 + i % 5)) for i in range(n)]
    labels = [i % 3 for i in range(n)]
    return ClassificationTask(WordTokenizer(), texts, labels, texts[:9], labels[:9], num_labels=3, max_length=6)


def _adapted_lm(method="lora"):
    torch.manual_seed(0)  # LoRA's init draws from the global RNG (as PEFT's does)
    return adapt(tiny_llama(seed=0, vocab_size=1000), method, 4, targets=["q_proj", "v_proj", "up_proj"])


def test_lr_schedule_warmup_then_cosine():
    lrs = [lr_at(s, 20, 1.0, 4, 0.1) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert math.isclose(lrs[-1], 0.1)


def test_linear_decay_is_a_straight_line_to_the_floor_and_constant_stays_at_peak():
    lrs = [lr_at(s, 14, 2.0, 4, 0.0, decay="linear") for s in range(14)]
    assert lrs[:4] == [0.5, 1.0, 1.5, 2.0]
    # after warmup: 2.0 at step 4 down to 0.0 at the last step, equal steps of 2.0 / 9
    assert all(math.isclose(a - b, 2.0 / 9) for a, b in zip(lrs[4:], lrs[5:]))
    assert lrs[-1] == 0.0
    assert [lr_at(s, 14, 2.0, 4, decay="constant") for s in range(4, 14)] == [2.0] * 10
    with pytest.raises(InvalidInputError, match="decay"):
        lr_at(5, 14, 2.0, 4, decay="step")
    with pytest.raises(InvalidInputError, match="decay"):
        TrainConfig(decay="exponential").validate()


def test_batches_are_epoch_permutations_and_deterministic():
    seen = torch.cat([batch_indices(k, 5, 20, seed=3) for k in range(4)])
    assert sorted(seen.tolist()) == list(range(20))  # one epoch: every example exactly once
    assert torch.equal(batch_indices(5, 7, 20, seed=3), batch_indices(5, 7, 20, seed=3))
    assert not torch.equal(batch_indices(0, 20, 20, seed=3), batch_indices(0, 20, 20, seed=4))


class Interrupt(Exception):
    pass


class FailingTask:
    """Wraps a task; raises Interrupt (a crash) or returns NaN (a divergence) at a given micro-batch."""

    def __init__(self, task, at, nan=False):
        self.task, self.at, self.nan, self.calls = task, at, nan, 0
        self.name, self.metric, self.higher_is_better, self.num_train = task.name, task.metric, task.higher_is_better, task.num_train

    def batch(self, idx):
        return self.task.batch(idx)

    def loss(self, module, batch):
        self.calls += 1
        if self.calls == self.at:
            if self.nan:
                return torch.tensor(float("nan"), requires_grad=True)
            raise Interrupt
        return self.task.loss(module, batch)

    def evaluate(self, module):
        return self.task.evaluate(module)


def test_resume_from_checkpoint_is_exact(tmp_path):
    config = TrainConfig(steps=6, batch_size=4, lr=1e-2, checkpoint_every=3, warmup_ratio=0.3)
    straight = _adapted_lm()
    ref = train(straight, _lm_task(), config, out_dir=tmp_path / "a")
    model = _adapted_lm()
    with pytest.raises(Interrupt):
        train(model, FailingTask(_lm_task(), at=5), config, out_dir=tmp_path / "b")  # dies during step 5
    resumed_model = _adapted_lm()  # a fresh process: new model, state only from disk
    resumed = train(resumed_model, _lm_task(), config, out_dir=tmp_path / "b")
    assert resumed.resumed_from == 3
    assert resumed.losses == ref.losses
    for (n, p), q in zip(straight.named_parameters(), resumed_model.parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(InvalidInputError, match="different settings"):
        train(_adapted_lm(), _lm_task(), TrainConfig(steps=6, batch_size=4, lr=5e-3, checkpoint_every=3), out_dir=tmp_path / "b")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    config = TrainConfig(steps=8, batch_size=4, checkpoint_every=2)
    # the advice must work: resuming would repeat the same steps (and a changed --lr is refused), so start afresh
    with pytest.raises(NumericalError, match=r"loss became nan at step 5.*last good checkpoint is kept in.*start afresh"):
        train(_adapted_lm(), FailingTask(_lm_task(), at=5, nan=True), config, out_dir=tmp_path)
    meta = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())
    assert meta["step"] == 4 and all(math.isfinite(h["loss"]) for h in meta["history"])
    with pytest.raises(NumericalError, match="no checkpoint was written yet"):
        train(_adapted_lm(), FailingTask(_lm_task(), at=2, nan=True), config)
    # at step 1 nothing has been updated yet: the rate cannot be the cause, and the message does not suggest it
    with pytest.raises(NumericalError, match="before any update, so the learning rate is not the cause") as refused:
        train(_adapted_lm(), FailingTask(_lm_task(), at=1, nan=True), config)
    assert "lower learning rate" not in str(refused.value)


def test_gradient_accumulation_equals_larger_batch():
    # float64: two half batches and one batch sum the same gradients in different orders, and AdamW divides by
    # sqrt(v), which can turn rounding on a near-zero gradient into a step of ~lr; in float64 the runs differ by
    # ~1e-17, so 1e-10 leaves a wide margin and still sees Adam's eps reacting to a gradient off by a factor 2 (~1e-9)
    one = _adapted_lm().double()
    train(one, _lm_task(), TrainConfig(steps=2, batch_size=4, grad_accum=1, max_grad_norm=None))
    acc = _adapted_lm().double()
    train(acc, _lm_task(), TrainConfig(steps=2, batch_size=2, grad_accum=2, max_grad_norm=None))
    for p, q in zip(one.parameters(), acc.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-10)


def test_training_reduces_loss_and_only_adapter_and_head_train():
    task = _cls_task()
    model = adapt(tiny_bert(vocab_size=1000), "pica", 4, targets=["query", "value"])
    clf = task.wrap(model)
    assert clf.pooling == "mean"
    frozen = {n: p.detach().clone() for n, p in clf.named_parameters() if not p.requires_grad}
    result = train(clf, task, TrainConfig(steps=30, batch_size=8, lr=3e-2, eval_every=10))
    assert sum(result.losses[-5:]) < sum(result.losses[:5])
    assert [e["step"] for e in result.evals] == [10, 20, 30] and 0 <= result.final["accuracy"] <= 1
    for n, p in clf.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n


def test_last_token_pooling_ignores_right_padding():
    task = _cls_task()
    clf = task.wrap(adapt(tiny_llama(vocab_size=1000), "lora", 2, targets=["q_proj"]))
    assert clf.pooling == "last"
    batch = task.batch(torch.arange(6))
    assert (batch["attention_mask"] == 0).any()  # the batch really is padded
    together = clf(batch["input_ids"], batch["attention_mask"])
    for i in range(6):
        n = int(batch["attention_mask"][i].sum())
        alone = clf(batch["input_ids"][i : i + 1, :n], batch["attention_mask"][i : i + 1, :n])
        assert_rounding_close(together[i], alone[0], clf)  # padded batch vs one row: other shapes, other orders


def test_top_k_layers_and_bad_input():
    model = tiny_llama(num_layers=4)
    assert top_layers(model, 2) == [2, 3]
    adapted = adapt(model, "lora", 2, top_k_layers=1)
    assert {n.split(".")[2] for n, _ in adapted.adapted_layers()} == {"3"}
    with pytest.raises(InvalidInputError, match="between 1 and 4"):
        top_layers(tiny_llama(num_layers=4), 5)
    with pytest.raises(InvalidInputError, match="no option"):
        adapt(tiny_llama(), "pica", 2, colour="red")
    with pytest.raises(InvalidInputError, match="no trainable parameters"):
        train(tiny_llama().requires_grad_(False), _lm_task(), TrainConfig(steps=1))
    with pytest.raises(InvalidInputError, match="labels must lie"):
        ClassificationTask(WordTokenizer(), ["a"], [5], ["a"], [0], num_labels=3)


def test_training_in_slices_equals_one_run(tmp_path):
    config = TrainConfig(steps=6, batch_size=4, lr=1e-2, warmup_ratio=0.3)
    straight = _adapted_lm()
    ref = train(straight, _lm_task(), config)
    sliced = _adapted_lm()
    first = train(sliced, _lm_task(), config, out_dir=tmp_path, stop_after=2)  # checkpoint written at the stop
    assert first.steps == 2 and first.final == {} and (tmp_path / "checkpoint" / "trainer.json").is_file()
    train(_adapted_lm(), _lm_task(), config, out_dir=tmp_path, stop_after=4)  # each slice a fresh model, as a new process
    last = train(_adapted_lm(), _lm_task(), config, out_dir=tmp_path)
    assert last.resumed_from == 4 and last.losses == ref.losses and last.final == ref.final
    with pytest.raises(InvalidInputError, match="stop_after"):
        train(_adapted_lm(), _lm_task(), config, stop_after=0)


class RecordingTask(LanguageModelingTask):
    """Records the example indices of every batch it builds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def batch(self, indices):
        self.seen.append(indices.tolist())
        return super().batch(indices)


def test_pretraining_from_windows_is_deterministic_schedules_the_lr_and_counts_tokens():
    """The optimizer comparison's needs (formerly optim/lm_pretraining): floor schedule, same seeded batches for every
    optimizer, clipping, periodic held-out evaluation, tokens seen."""
    from rankwise.optim import LoRAPre
    from rankwise.core.training.optimizer import adamw

    assert lr_at(0, 10, 1.0, 2, 0.1) == 0.5 and lr_at(1, 10, 1.0, 2, 0.1) == 1.0
    assert lr_at(9, 10, 1.0, 2, 0.1) == pytest.approx(0.1) and lr_at(10, 10, 1.0, 2, 0.1) == pytest.approx(0.1)
    windows = torch.randint(0, 64, (12, 16), generator=torch.Generator().manual_seed(0))
    config = TrainConfig(steps=4, batch_size=4, lr=1e-2, warmup_ratio=0.25, min_lr_ratio=0.1, max_grad_norm=1.0, eval_every=2, seed=1)
    lora_pre = lambda module, cfg: LoRAPre(module.parameters(), lr=cfg.lr, rank=None)  # noqa: E731  (the loop is optimizer-agnostic)
    runs, batches = [], []
    for factory in (lora_pre, lora_pre, adamw()):
        model = tiny_llama(0, vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=24)
        task = RecordingTask(windows, windows[:2], name="pretrain")
        run = train(model, task, config, optimizer=factory)
        assert run.optimizer.param_groups[0]["lr"] == 1e-2  # the peak lr is restored afterwards
        assert [h["lr"] for h in run.history] == [lr_at(s, 4, 1e-2, 1, 0.1) for s in range(4)]
        assert all(h["grad_norm"] > 0 for h in run.history)
        runs.append(run)
        batches.append(task.seen)
    a, b, other = runs
    assert (a.losses, a.eval_curve()) == (b.losses, b.eval_curve())  # same seed, same numbers
    assert [s for s, _ in a.eval_curve()] == [2, 4] and a.eval_curve()[-1][1] == a.final["eval_loss"]
    assert batches[0] == batches[1] == batches[2]  # every optimizer sees the same batches in the same order
    assert a.tokens_seen == 4 * 4 * 16 and [h["tokens"] for h in a.history] == [64, 128, 192, 256]
    assert other.losses[0] == a.losses[0] and other.losses != a.losses  # same first batch, different optimizer


def test_gradient_clipping_bounds_the_update_norm():
    sgd = lambda module, cfg: torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=cfg.lr)  # noqa: E731
    for max_norm in (1e-3, None):
        model = _adapted_lm()
        before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        run = train(model, _lm_task(), TrainConfig(steps=1, batch_size=4, lr=1.0, warmup_ratio=0.0, max_grad_norm=max_norm), optimizer=sgd)
        moved = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.detach() - q) for p, q in
                                                      zip([p for p in model.parameters() if p.requires_grad], before)]))
        assert run.history[0]["grad_norm"] > 1e-3  # the norm before clipping is what is reported
        # float32: p - step rounds each entry by <= eps / 2 of |p| (so the move is off by <= eps * ||p||), and each
        # float32 norm of ~3e3 terms by a few eps (64 eps here); a missing or doubled clip is O(1) off
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])
        rounding = EPS32 * float(torch.linalg.vector_norm(params))
        if max_norm is None:  # SGD at lr 1 moves by the gradient
            grad_norm = run.history[0]["grad_norm"]
            assert abs(float(moved) - grad_norm) <= rounding + 64 * EPS32 * grad_norm
        else:
            assert float(moved) <= max_norm * (1 + 64 * EPS32) + rounding
