"""The one training loop and its contracts, below every method package so that methods, layers and apps can train
with it (a `Task` of their own, a `TrainConfig`), and so that a method's `Procedure` can live beside its maths.

    from rankwise.core.training import TrainConfig, train
    result = train(module, task, TrainConfig(steps=200, lr=1e-3), out_dir="run")   # checkpoints, exact resume, DDP

`fit` is the same schedule, clipping and NaN guard for a loop whose batches are not examples of a task (a loss
that is a function of the step): layers fitted to activations, implicit neural representations, toy dynamics.
"""

from rankwise.core.training.contracts import Task, TrainConfig, TrainResult, count_tokens
from rankwise.core.training.fitting import FitResult, fit
from rankwise.core.training.loop import batch_indices, summary, train
from rankwise.core.training.optimizer import OptimizerFactory, adamw, optimizer_label
from rankwise.core.training.procedure import RUNNERS, Procedure, ProcedureBuilder
from rankwise.core.training.schedule import DECAYS, lr_at
from rankwise.core.training.tensor_tasks import TensorClassificationTask

__all__ = ["Task", "TrainConfig", "TrainResult", "count_tokens", "FitResult", "fit", "batch_indices", "summary", "train",
           "OptimizerFactory", "adamw", "optimizer_label", "RUNNERS", "Procedure", "ProcedureBuilder", "DECAYS", "lr_at", "TensorClassificationTask"]
