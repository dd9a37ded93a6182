"""What every install has, whatever its methods: the general commands, the plain LoRA adapter, AdamW and GaLore
(a peer baseline), and the text tasks of the embedded corpus. Method contributions come from their records."""

from __future__ import annotations

from rankwise.registry.records import AdapterEntry, BenchmarkEntry, Command, FolderFormat, OptimizerEntry, TaskEntry

GENERAL_COMMANDS: tuple[Command, ...] = (
    Command("list", "rankwise.commands.list"),
    Command("repro", "rankwise.commands.repro"),
    Command("demo", "rankwise.commands.demo"),
    Command("eval", "rankwise.commands.eval"),
    Command("cache", "rankwise.commands.cache"),
    Command("info", "rankwise.commands.info"),
    Command("audit", "rankwise.commands.audit"),
    Command("run", "rankwise.commands.run"),
)
COMMAND_GROUPS = {"convert": "convert a model (e.g. GQA attention to multi-head latent attention)",
                  "lorsa": "inspect a fitted low-rank sparse attention (Lorsa) replacement"}

GENERAL_ADAPTERS: tuple[AdapterEntry, ...] = (
    AdapterEntry("lora", "rankwise.adapters.lora:LoraAdapter"),  # also PiSSA: LoraConfig(init="pissa")
)
GENERAL_OPTIMIZERS: tuple[OptimizerEntry, ...] = (
    OptimizerEntry("adamw", "rankwise.core.training.optimizer:adamw"),
    # galore-torch's GaLoreAdamW: its state holds a projector object, which a checkpoint cannot store
    OptimizerEntry("galore", "rankwise.optim.factories:galore", low_rank=True, checkpointable=False),
)
GENERAL_TASKS: tuple[TaskEntry, ...] = (
    TaskEntry("wiki-topics", "rankwise.training.tasks:wiki_topics", "text-classification",
              "12-class topic classification of Wikipedia lead summaries"),
    TaskEntry("wiki-lm", "rankwise.training.tasks:wiki_lm", "language-modelling",
              "next-token prediction on Wikipedia lead summaries", causal=True),
    TaskEntry("fashion-mnist-5to9", "rankwise.training.tasks:fashion_mnist_5to9_task", "image-classification",
              "Fashion-MNIST classes 5-9 on a backbone pretrained on 0-4", inputs="images"),
)
GENERAL_BENCHMARKS: tuple[BenchmarkEntry, ...] = (
    BenchmarkEntry("lora", "bench_lora.py"),  # LoRA training step against peft and the frozen-model floor
)
GENERAL_FOLDER_FORMATS: tuple[FolderFormat, ...] = (
    # `finetune --method full` on a vision backbone writes DIR/model in this format
    FolderFormat("vision-backbone", "rankwise.models.vision:load_backbone_folder"),
)
