"""Reproduction `wasi:vision`: the paper's vision setting on this machine's stand-in -- the TinyViT pretrained here
on Fashion-MNIST classes 0-4 (`models.vision.pretrained_backbone("tiny-vit-fmnist-0to4")`) fine-tuned on classes
5-9 (`training.image_tasks.fashion_mnist_5to9`) with a new head, WASI on every MLP linear (blocks[i].mlp.fc1 64 ->
256 and fc2 256 -> 64, 4 blocks), against the same arms as the text experiment (`protocol`).

Every step backpropagates through all four blocks (the first block's MLP is trained), attention, norms and the
patch embedding frozen. Batches are 128 images (the paper's batch), 17 tokens (16 patches + CLS): every batch has
the same [128, 17, D] shape, as ASI's warm start wants. Training and validation images come from Fashion-MNIST's
train part (none seen in pretraining: those were classes 0-4), test images from its test part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.core.report import Report
from rankwise.repro.setup import BySize, experiment_model
from rankwise.repro.wasi.protocol import Settings, declare, run_protocol
from rankwise.training.image_tasks import BackboneClassifier, ImageClassificationTask, fashion_mnist_5to9


@dataclass(frozen=True)
class VisionSettings:
    train: int
    val: int
    test: int
    protocol: Settings


SIZES = BySize(
    smoke=VisionSettings(train=64, val=32, test=32,
                         protocol=Settings(steps=2, batch=16, lr_grid=(0.1,), seeds=1, max_extend=0)),
    full=VisionSettings(train=5000, val=1000, test=2000,
                        protocol=Settings(steps=90, batch=128, lr_grid=(0.1, 0.3, 1.0), seeds=5)),
)


def run(size: str = "smoke", seed: int = 0) -> Report:
    v = SIZES[size]
    s = v.protocol
    report = Report("wasi", "WASI on a TinyViT pretrained on Fashion-MNIST 0-4, fine-tuned on 5-9, vs vanilla, LoRA, "
                    "WSI, ASI and SVD truncation + LoRA", size, seed)
    testbed = f"tiny-vit-fmnist-0to4 all MLP linears, fashion-mnist 5-9 {v.train}/{v.val}/{v.test}, batch {s.batch}"
    declare(report, s.eps_low, s.eps_high, testbed)
    backbone, _ = experiment_model("tiny-vit-fmnist-0to4", size, seed)
    data = fashion_mnist_5to9(28, v.train + v.val, v.test, seed)
    order = torch.randperm(data.num_train, generator=torch.Generator().manual_seed(seed))
    tr, va = order[: v.train], order[v.train :]
    task = ImageClassificationTask("fashion-mnist-5to9", data.x[tr], data.y[tr], data.x[va], data.y[va])
    test = ImageClassificationTask("fashion-mnist-5to9 test", data.x[tr], data.y[tr], data.x_eval, data.y_eval)
    base = BackboneClassifier(backbone, task.num_labels).eval()
    targets = [n for n, _ in base.named_modules() if n.endswith(("mlp.fc1", "mlp.fc2"))]
    run_protocol(report, s, base, targets, task, test, seed)
    report.note(f"Testbed: the TinyViT pretrained here on Fashion-MNIST classes 0-4 (4 blocks, width 64, MLP 256, 16 "
                f"7x7 patches + CLS), a new 5-way head, classes 5-9: {v.train} training / {v.val} validation images "
                f"from the train part (drawn by the seed), {v.test} test images from the test part. Trained: the 8 "
                "MLP linears and the head; everything else frozen (backprop still runs through every block).")
    report.note(f"Training: the loop with SGD (momentum 0, weight decay {s.weight_decay}, clip {s.max_grad_norm}, the "
                f"paper's), cosine decay, {s.steps} steps of batch {s.batch}; each arm's lr chosen on validation "
                f"accuracy from {list(s.lr_grid)} (extended off an edge) on the first seed, then {s.seeds} seeds. "
                f"LoRA rank {s.lora_rank}; SVD + LoRA truncates at WASI's rank (eps {s.eps_high}).")
    report.note("What the stand-in changes: a ViT of ~0.2M parameters pretrained for minutes on 20k grey 28x28 images, "
                "instead of ImageNet ViT-B/32 or SwinT, and one transfer inside Fashion-MNIST instead of CIFAR, CUB, "
                "Flowers and Pets. Its weights are close to their random initialisation (flat spectra: K at eps 0.9 is "
                "~49 of 64), so WSI cuts little weight memory here; the activation subspaces are strongly low-rank.")
    return report.finish()


__all__ = ["run", "SIZES"]
