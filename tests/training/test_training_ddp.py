"""The training harness under DDP: 2 processes (gloo, CPU) launched as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT set; `train` joins the group itself) give the parameters of one process on the same global
batch, for an adapter, full training with AdamW and full training with LoRA-Pre; only rank 0 writes checkpoints,
and a run resumed under DDP continues exactly.

Tolerance: every run is float64. Both set-ups compute the same global-batch gradient summed in another order (DDP
averages two half-batch means, one process takes the mean over the whole batch), so each gradient entry differs
by at most ~ n u sum|terms| with u = 1.1e-16, n <~ 1e3 terms of magnitude <~ 1: |dg| <~ 1e-13. AdamW's step
lr m / (sqrt(v) + eps) changes by at most (lr / eps) |dg| = (1e-2 / 1e-8) 1e-13 = 1e-7 per step (the worst case,
for |g| ~ eps; clipping rescales both runs by the same norm up to u), so over 4 steps the parameters differ by
< 4e-7 plus second-order growth through the tiny model: atol 1e-6. In fp32 (u = 6e-8) the same bound would be
~1e2, i.e. no bound at all, which is why the test runs in float64.
"""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import functional as F

from rankwise.errors import InvalidInputError, NumericalError
from rankwise.models import tiny_bert, tiny_llama
from rankwise.adapters import adapt
from rankwise.training import ClassificationTask, LanguageModelingTask, TrainConfig, train
from rankwise.core.training.optimizer import adamw
from rankwise.optim.factories import lora_pre
from rounding import network_tol

pytestmark = [pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
              pytest.mark.method("lora-pre")]

WORLD = 2
ATOL = 1e-6  # derived in the module docstring
CONFIG = dict(steps=4, batch_size=4, lr=1e-2, warmup_ratio=0.25, min_lr_ratio=0.1, max_grad_norm=1.0)


class WordTokenizer:
    pad_token_id, eos_token_id = 0, 0

    def __call__(self, texts, truncation=True, max_length=None):
        return {"input_ids": [[1 + sum(map(ord, w)) % 90 for w in t.split()][:max_length] for t in texts]}


class Float64LM(LanguageModelingTask):
    """Next-token cross-entropy in the logits' dtype: transformers' own LM loss casts logits to fp32, which would put
    fp32 rounding back into a float64 comparison."""

    def loss(self, module, batch):
        ids = batch["input_ids"]
        logits = module(input_ids=ids).logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def _lm_task():
    gen = torch.Generator().manual_seed(0)
    return Float64LM(torch.randint(0, 100, (16, 8), generator=gen), torch.randint(0, 100, (4, 8), generator=gen))


def _cls_task():
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    texts = [" ".join(words[(i * k) % 6] for k in range(1, 3 + i % 5)) for i in range(20)]  # unequal lengths: padded
    labels = [i % 3 for i in range(20)]
    return ClassificationTask(WordTokenizer(), texts, labels, texts[:6], labels[:6], num_labels=3, max_length=6)


def _scenario(name: str):
    """(module, task, config, optimizer factory) for one scenario, built identically in every process."""
    torch.manual_seed(0)  # LoRA's init and the classification head draw from the global RNG
    if name == "lora":  # an adapter: the base is frozen, only the LoRA factors train (and are all-reduced)
        module = adapt(tiny_llama(0, vocab_size=100, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                  intermediate_size=24).double(), "lora", 2, targets=["q_proj", "v_proj"])
        return module, _lm_task(), TrainConfig(**CONFIG, grad_accum=2, checkpoint_every=2), adamw()
    if name == "full-adamw":  # every weight of an encoder + classification head, padded batches
        task = _cls_task()
        module = task.wrap(tiny_bert(0, vocab_size=100, hidden_size=16, num_layers=1)).double().requires_grad_(True)
        for m in module.modules():  # dropout masks depend on how the batch is split: no run could match them
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        return module, task, TrainConfig(**CONFIG, eval_every=2), adamw()
    if name == "full-lora-pre":  # full training with low-rank optimizer states
        module = tiny_llama(0, vocab_size=100, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=24).double()
        return module, _lm_task(), TrainConfig(**CONFIG, weight_decay=0.01), lora_pre(2)
    raise KeyError(name)


SCENARIOS = ("lora", "full-adamw", "full-lora-pre")


def _params(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


class NanOnRank:
    """Wraps a task: the loss is NaN on one rank only, at its first micro-batch."""

    def __init__(self, task, nan_rank):
        self.task, self.nan_rank = task, nan_rank
        self.name, self.metric, self.higher_is_better, self.num_train = task.name, task.metric, task.higher_is_better, task.num_train

    def batch(self, idx):
        return self.task.batch(idx)

    def loss(self, module, batch):
        loss = self.task.loss(module, batch)
        return loss * float("nan") if dist.get_rank() == self.nan_rank else loss

    def evaluate(self, module):
        return self.task.evaluate(module)


def _worker(rank: int, port: int, out: str) -> None:
    import os
    from pathlib import Path

    import rankwise.core.training.loop as loop
    from rankwise.core.training import distributed

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    out_dir = Path(out)
    writes = []
    real_save = loop.save_checkpoint
    loop.save_checkpoint = lambda *a, **k: (writes.append(rank), real_save(*a, **k))  # who writes checkpoints
    try:
        results = {}
        for name in SCENARIOS:
            module, task, config, factory = _scenario(name)
            run_dir = out_dir / name
            if name == "lora":  # in two slices, each a fresh model resumed from the checkpoint (as a new launch)
                train(module, task, config, out_dir=run_dir, optimizer=factory, stop_after=2)
                module, task, config, factory = _scenario(name)
            result = train(module, task, config, out_dir=run_dir, optimizer=factory)
            results[name] = {"params": _params(module), "losses": result.losses, "final": result.final,
                             "tokens": result.tokens_seen, "resumed_from": result.resumed_from, "world": result.world_size}
        module, task, _, _ = _scenario("lora")
        try:
            train(module, task, TrainConfig(steps=1, batch_size=3))
        except InvalidInputError as e:
            results["odd-batch"] = str(e)
        module, task, config, _ = _scenario("lora")
        try:
            train(module, NanOnRank(task, nan_rank=1), TrainConfig(steps=2, batch_size=4))
        except NumericalError as e:  # every rank stops (none hangs in an all-reduce), at the same step
            results["nan"] = str(e)
        torch.save({"results": results, "writes": writes}, out_dir / f"rank{rank}.pt")
    finally:
        distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_match_one_process(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert ranks[0]["writes"] and set(ranks[0]["writes"]) == {0} and ranks[1]["writes"] == []  # only rank 0 writes
    meta = json.loads((tmp_path / "lora" / "checkpoint" / "trainer.json").read_text())
    assert meta["step"] == 4  # the last periodic checkpoint
    for name in SCENARIOS:
        module, task, config, factory = _scenario(name)
        ref = train(module, task, config, optimizer=factory)  # one process, the same global batches
        want = _params(module)
        for r, saved in enumerate(ranks):
            got = saved["results"][name]
            assert got["world"] == WORLD and got["tokens"] == ref.tokens_seen
            assert got["params"].keys() == want.keys()
            for n in want:
                torch.testing.assert_close(got["params"][n], want[n], rtol=0, atol=ATOL, msg=f"{name} rank {r}: {n}")
            assert got["losses"] == pytest.approx(ref.losses, rel=1e-9, abs=1e-9)
            # The evaluation (perplexity) runs in fp32 on float64 parameters that agree to ~1e-13: rel 1e-6 covers
            # the fp32 cast and summation (u = 6e-8 times a few dozen tokens).
            assert got["final"] == pytest.approx(ref.final, rel=1e-6)
        assert ranks[0]["results"][name]["params"].keys() == ranks[1]["results"][name]["params"].keys()
        for n, p in ranks[0]["results"][name]["params"].items():  # the ranks hold the very same model
            assert torch.equal(p, ranks[1]["results"][name]["params"][n]), n
    assert ranks[0]["results"]["lora"]["resumed_from"] == 2
    for saved in ranks:
        assert "multiple of the 2 ranks" in saved["results"]["odd-batch"]
        assert "at step 1" in saved["results"]["nan"]


def test_unused_parameters_are_found_from_the_graph():
    """Why the encoder scenario needs find_unused_parameters: BERT's pooler is not reached by the pooled head."""
    from rankwise.core.training.checkpoint import trainable
    from rankwise.core.training.loop import _unused_parameters

    module, task, _, _ = _scenario("full-adamw")
    rng = torch.get_rng_state()
    unused = _unused_parameters(module, task, task.batch(torch.arange(2)), trainable(module))
    assert unused and all(".pooler." in n for n in unused)
    assert torch.equal(torch.get_rng_state(), rng)  # the probe leaves no trace
    module, task, _, _ = _scenario("lora")
    assert _unused_parameters(module, task, task.batch(torch.arange(2)), trainable(module)) == []


def test_finetune_command_under_torchrun(tmp_path):
    """`torchrun --nproc_per_node 2 -m rankwise.cli finetune ...`: the losses of one process, and one set of files."""
    import os
    import subprocess
    import sys

    from rankwise.cli import main
    from rankwise.core.io import verify_manifest
    from rankwise.models import load_smollm2_tokenizer

    base = tmp_path / "base"
    tiny_llama(0, num_layers=1).save_pretrained(base)
    load_smollm2_tokenizer().save_pretrained(base)
    args = ["finetune", "--model", str(base), "--task", "wiki-lm", "--method", "lora", "--rank", "2", "--steps", "3",
            "--batch-size", "4", "--seq-len", "16", "--train-examples", "32", "--eval-examples", "4", "--checkpoint-every", "2"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m", "rankwise.cli",
         "--quiet", *args, "--out", str(tmp_path / "two")],
        env={**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote") == 1 and "on 2 processes" in done.stdout  # rank 0 alone reports and writes
    one, two = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    assert two["world_size"] == 2 and two["tokens_seen"] == one["tokens_seen"] == 3 * 4 * 16
    # fp32 here (the CLI's dtype): the first loss differs only by reassociation, the network bound of the 1-layer,
    # width-64 model at |loss| ~ 11 (~7e-4; measured 5e-7); later ones also by AdamW steps from rounding-different
    # gradients, whose large relative changes fall on near-zero gradient entries, to which the loss is insensitive
    losses = [h["loss"] for h in one["history"]]
    assert [h["loss"] for h in two["history"]] == pytest.approx(losses, rel=0, abs=network_tol(torch.float32, max(losses), 1, 64))
    verify_manifest(tmp_path / "two" / "adapter")
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["adapter", "checkpoint", "metrics.json", "rankwise-run.json"]  # no leftovers
