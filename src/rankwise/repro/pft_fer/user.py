"""`rankwise run pft-fer:personalise`: PFT's stage 2 on your own person's neutral frames.

    rankwise run pft-fer neutral=neutral.safetensors test=test.safetensors --out DIR

`neutral`: a safetensors file with "images" float32 [N, 1, 48, 48] in [0, 1], one person's neutral frames (any
"labels" there must all be 0: PFT adapts on neutral frames only). `test` (optional): "images" and "labels" (0
neutral, 1 expressive) of the same person, scored after adaptation. The source model is this reproduction's: the
48x48 face CNN trained on 30 procedural source subjects, with its stage-1 translator (trained here in about a
minute at 1 thread, from `seed`). With a source model of your own, call `rankwise.apps.vision.pft.personalise`
from Python (any module with `features`, optional `bottleneck` and `classifier`). DIR receives the adapted
translator (translator.safetensors) and, with `test`, predictions.safetensors; result.json holds the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from rankwise.apps.vision.pft import PftConfig, expression_metrics, personalise, pretrain_translator
from rankwise.apps.vision.pft.adapt import check_images, check_neutral_labels
from rankwise.core.options import option
from rankwise.errors import InvalidInputError

IMAGE_SHAPE = (1, 48, 48)


@dataclass(frozen=True)
class PersonaliseConfig:
    neutral: str = field(metadata=option(metavar="FILE.safetensors", help="'images' [N,1,48,48] in [0,1]: neutral frames"))
    test: str = field(default="", metadata=option(metavar="FILE.safetensors", help="'images' and 'labels' (0/1) to score; '' = none"))
    lr: float = 1e-3
    steps: int = 40
    seed: int = 0
    source_steps: int = 600
    pretrain_steps: int = 400

    def validate(self) -> None:
        for name in ("neutral",) + (("test",) if self.test else ()):
            if not Path(getattr(self, name)).is_file():
                raise InvalidInputError(f"{name}={getattr(self, name)!r} is not a file: pass a safetensors file with 'images'")
        if self.steps < 1 or self.source_steps < 1 or self.pretrain_steps < 0:
            raise InvalidInputError("steps and source_steps must be >= 1, pretrain_steps >= 0")
        PftConfig(lr=self.lr, steps=self.steps, seed=self.seed).validate()


def _read(path: str, what: str, need_labels: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    from rankwise.core.io import load_tensors

    tensors = load_tensors(path)
    if "images" not in tensors:
        raise InvalidInputError(f"{path} holds {sorted(tensors)}; it needs 'images' [N, 1, 48, 48]")
    images = tensors["images"].float()
    check_images(images, what, IMAGE_SHAPE)
    labels = tensors.get("labels")
    if need_labels and labels is None:
        raise InvalidInputError(f"{path} needs 'labels' (0 neutral, 1 expressive) to be scored")
    return images, None if labels is None else labels.long()


def run_on_files(config: PersonaliseConfig, out: Path) -> dict:
    """Check both files, build the source model and its stage-1 translator, adapt on the neutral frames, score."""
    from rankwise.core.io import save_tensors_atomic
    from rankwise.repro.pft_fer.data import make_world, train_source_model

    config.validate()
    neutral, neutral_labels = _read(config.neutral, "neutral images", need_labels=False)
    check_neutral_labels(neutral_labels, neutral.shape[0])
    test = _read(config.test, "test images", need_labels=True) if config.test else None
    world = make_world(config.seed, 1000 * config.seed, 25, 1, 1)
    model, held_out = train_source_model(world.source, config.seed, config.source_steps)
    translator = (pretrain_translator(model, world.source.images, world.source.labels, world.source.subjects,
                                      PftConfig(pretrain_steps=config.pretrain_steps, batch_size=32, seed=config.seed))
                  if config.pretrain_steps else None)
    result = personalise(model, neutral, PftConfig(lr=config.lr, steps=config.steps, seed=config.seed),
                         translator=translator, labels=neutral_labels)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomic(out / "translator.safetensors", {k: v.detach() for k, v in result.model.translator.state_dict().items()})
    summary = {"neutral_frames": int(neutral.shape[0]), "source_held_out_accuracy": held_out,
               "final_loss": result.losses[-1] if result.losses else None}
    if test is not None:
        images, labels = test
        summary["adapted"] = expression_metrics(result.model, images, labels)
        summary["source_only"] = expression_metrics(model, images, labels)
        with torch.no_grad():
            predictions = result.model(images).argmax(1)
        save_tensors_atomic(out / "predictions.safetensors", {"predictions": predictions})
    return summary
