"""Fine-tuning harness: tasks (wiki LM, wiki-topics classification), the training loop, checkpoints, method setup.

    from rankwise.training import TrainConfig, adapt, topic_classification, train
    task = topic_classification(tokenizer, max_length=32)
    model = adapt(minilm, "pica", rank=8)               # any registered adapter type
    classifier = task.wrap(model)                        # model + pooled linear head (trainable)
    result = train(classifier, task, TrainConfig(steps=200, lr=1e-3), out_dir="run")
"""

from rankwise.training.distillation import DistillationTask, distillation_loss
from rankwise.training.loop import TrainConfig, TrainResult, batch_indices, summary, train
from rankwise.training.methods import DEFAULT_TARGETS, adapt, available_methods, build_config, default_targets, top_layers
from rankwise.training.schedule import lr_at
from rankwise.training.tasks import ClassificationTask, LanguageModelingTask, SequenceClassifier, topic_classification

__all__ = [
    "TrainConfig", "TrainResult", "batch_indices", "summary", "train", "DEFAULT_TARGETS", "adapt", "available_methods",
    "build_config", "default_targets", "top_layers", "lr_at", "ClassificationTask", "LanguageModelingTask",
    "SequenceClassifier", "topic_classification", "DistillationTask", "distillation_loss",
]
