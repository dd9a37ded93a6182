"""Image-classification tasks for `rankwise finetune` (records in `registry/general.py`): a pretrained vision
backbone (`models.vision`, an embedded model) fine-tuned on images it was not pretrained on.

    rankwise finetune --model tiny-vit-fmnist-0to4 --task fashion-mnist-5to9 --method full --out DIR
    rankwise finetune --model tiny-vit-fmnist-0to4 --task fashion-mnist-5to9 --method lora --rank 4 \\
        --targets fc1,fc2 --out DIR

`fashion-mnist-5to9` is the transfer the vision stand-ins are built for: the ViT was pretrained on classes 0-4
(T-shirt .. Coat), the task is classes 5-9 (Sandal .. Ankle boot), relabelled 0-4; training images come from the
official train part (none of them seen in pretraining), evaluation images from the official test part.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.data.vision import load_fashion_mnist, resize, select_classes, subset
from rankwise.errors import InvalidInputError


class BackboneClassifier(nn.Module):
    """backbone (optionally adapted) -> `features(x)` [B, width] -> a new linear head -> logits [B, num_labels]."""

    def __init__(self, model: nn.Module, num_labels: int) -> None:
        super().__init__()
        if not callable(getattr(model, "features", None)) or not hasattr(model, "width"):
            raise InvalidInputError(f"an image task needs a vision backbone with features(x) and width (e.g. "
                                    f"tiny-vit-fmnist-0to4), got {type(model).__name__}")
        self.model = model
        self.head = nn.Linear(model.width, num_labels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.model.features(images))


class ImageClassificationTask(TensorClassificationTask):
    """Cross-entropy on images [N, C, H, W] and labels [N]; `wrap(backbone)` puts a new head on the backbone's
    features (its pretraining head is left unused), as `SequenceClassifier` does for text."""

    def wrap(self, model: nn.Module) -> nn.Module:
        return BackboneClassifier(model, self.num_labels)


def fashion_mnist_5to9(image_size: int = 28, train_examples: int | None = None, eval_examples: int | None = None,
                       seed: int = 0) -> ImageClassificationTask:
    """Fashion-MNIST classes 5-9 relabelled 0-4: `train_examples` (default: all 30,000) from the train part,
    `eval_examples` (default: all 5,000) from the test part, stratified subsets drawn by `seed`, at `image_size`."""
    parts = []
    for part, n in (("train", train_examples), ("test", eval_examples)):
        data = select_classes(load_fashion_mnist(part), range(5, 10))
        if n is not None:
            data = subset(data, n, seed)
        if image_size != data.images.size(-1):
            data = resize(data, image_size)
        parts.append(data)
    (train, test) = parts
    task = ImageClassificationTask("fashion-mnist-5to9", train.images, train.labels, test.images, test.labels)
    return task
