"""The experiment's network: `models.vision.FullyConnectedNet` ("mlp": a tanh net on 28x28 images, the card's
FCN, DFA's natural setting), pretrained with backprop on Fashion-MNIST through `models.vision.pretrained_backbone`
(which caches it).
"""

from __future__ import annotations

from rankwise.models.vision import BackboneRecipe, FullyConnectedNet

ARCHITECTURE = "mlp"
__all__ = ["ARCHITECTURE", "FullyConnectedNet", "fcn_recipe"]


def fcn_recipe(depth: int, hidden: int, num_train: int, epochs: int, seed: int = 0) -> BackboneRecipe:
    """BP pretraining of the `depth`-layer FCN on all 10 Fashion-MNIST classes (AdamW, the loop's defaults)."""
    return BackboneRecipe(name=f"fcn{depth}x{hidden}-fmnist", architecture=ARCHITECTURE,
                          model={"hidden": hidden, "depth": depth}, classes=tuple(range(10)), image_size=28,
                          num_train=num_train, num_eval=2_000, epochs=epochs, batch_size=128, lr=1e-3,
                          weight_decay=0.0, seed=seed)
