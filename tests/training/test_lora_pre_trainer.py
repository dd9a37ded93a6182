"""The documented example: LoRAPre handed to the transformers Trainer (docs/methods/lora-pre.md)."""

import math

import pytest
import torch

pytestmark = pytest.mark.method("lora-pre")


def test_trainer_runs_with_lora_pre(tmp_path):
    from transformers import Trainer, TrainingArguments

    from rankwise.models import tiny_llama
    from rankwise.optim import LoRAPre, low_rank_param_groups

    model = tiny_llama(0, vocab_size=128, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    windows = torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(0))
    train_dataset = [{"input_ids": w, "labels": w} for w in windows]
    optimizer = LoRAPre(low_rank_param_groups(model, rank=4), lr=3e-3, weight_decay=0.0)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    result = Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(optimizer, None)).train()
    assert result.global_step == 2 and math.isfinite(result.training_loss)
    state = optimizer.state[model.model.layers[0].mlp.up_proj.weight]
    assert state["m_B"].shape == (64, 4) and int(state["step"]) == 2
