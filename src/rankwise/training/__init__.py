"""The fine-tuning harness: the text tasks (wiki LM, wiki-topics classification, distillation), the procedure and
optimizer tables derived from the registry, healing of converted models, frozen-prefix execution, and the federated
engine (`training.federated`). The loop itself, its checkpoints, schedule and DDP live below the method packages in
`rankwise.core.training`, so that methods can train with it; they are re-exported here.

    from rankwise.adapters import adapt
    from rankwise.training import TrainConfig, topic_classification, train
    task = topic_classification(tokenizer, max_length=32)
    model = adapt(minilm, "pica", rank=8)               # any adapter type of rankwise.adapters.ADAPTER_TYPES
    classifier = task.wrap(model)                        # model + pooled linear head (trainable)
    result = train(classifier, task, TrainConfig(steps=200, lr=1e-3), out_dir="run")
"""

from rankwise.training.distillation import DistillationTask, distillation_loss
from rankwise.training.healing import HealConfig, HealResult, heal
from rankwise.core.training import TrainConfig, TrainResult, batch_indices, lr_at, summary, train
from rankwise.training.tasks import ClassificationTask, LanguageModelingTask, SequenceClassifier, topic_classification

__all__ = [
    "TrainConfig", "TrainResult", "batch_indices", "summary", "train", "lr_at", "ClassificationTask", "LanguageModelingTask",
    "SequenceClassifier", "topic_classification", "DistillationTask", "distillation_loss",
    "HealConfig", "HealResult", "heal",
]
