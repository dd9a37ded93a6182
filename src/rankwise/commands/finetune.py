"""`rankwise finetune --model minilm-l6 --task wiki-topics --method pica --rank 8 --out DIR`

Fine-tunes an embedded model with any registered adapter method, or all its weights (`--method full`), with AdamW
or a low-rank-state optimizer (`--optimizer lora-pre --optimizer-rank 8`), and writes to DIR:
  adapter/         a PEFT folder (peft.PeftModel.from_pretrained(base, DIR/adapter) loads it) + rankwise state;
                   for a classification task the head is in it too (PEFT modules_to_save), and both peft and
                   rankwise load it onto rankwise.training.SequenceClassifier(base, num_labels)
  model/           instead of adapter/ with --method full: the fine-tuned model and its tokenizer (transformers
                   save_pretrained; rankwise.models.load_model(DIR/model) reloads both); beside adapter/ with
                   --procedure lmao, which trains the base weights too: the updated base, the adapter's base model
  head.safetensors with --method full on a classification task: the classification head
  metrics.json     parameter counts, final evaluation, loss history
  checkpoint/      the last training checkpoint; rerunning the same command resumes from it

Under torchrun (`torchrun --nproc_per_node 2 -m rankwise.cli finetune ...`) every process trains a slice of each
batch (DDP, gloo on the CPU; --batch-size stays the global batch) and only rank 0 writes DIR; see docs/training.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.commands.choices import ADAPTER_METHODS, DECAYS, OPTIMIZERS, PROCEDURES, TASKS, UNCHECKPOINTABLE_OPTIMIZERS
from rankwise.core.options import parse_key_values
from rankwise.commands.common import (check_output, checkpoint_note, fraction, mark_run_folder,
                                      nonnegative_float, nonnegative_int, positive_float, positive_int, require_model)
from rankwise.models import folders
from rankwise.registry.tables import task_entries

FULL = "full"
# What `--model` may be: an original model, or a quantized one (LoRA on dequantized weights); not an adapter, an MLA
# conversion (its K/V projections are factor pairs, not nn.Linear) or a run folder.
ACCEPTS = frozenset({folders.EMBEDDED, folders.MODEL, folders.QUANTIZED, folders.MLA_DEPLOY})


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune an embedded model with an adapter method (LoRA, PiCa, ...)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="smollm2-135m, minilm-l6, or a transformers folder")
    p.add_argument("--task", required=True, choices=TASKS,
                   help="; ".join(f"{name}: {entry.summary}" for name, entry in task_entries().items()))
    p.add_argument("--method", required=True, choices=[*ADAPTER_METHODS, FULL],
                   help="an adapter method, or 'full' to fine-tune every weight")
    p.add_argument("--rank", type=positive_int, default=None, help="adapter rank (required for adapter methods; default: none)")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                   help="adamw, or a low-rank-state optimizer for full fine-tuning (lora-pre, galore)")
    p.add_argument("--optimizer-rank", type=positive_int, default=None, help="rank of the optimizer states (lora-pre, galore; default: none)")
    p.add_argument("--out", required=True, help="output folder (adapter/ or model/, metrics.json, checkpoint/)")
    p.add_argument("--targets", default=None, help="comma-separated module names (PEFT target_modules); default: the architecture's attention+MLP projections")
    p.add_argument("--targets-regex", default=None, help="a regex that must match whole module names (instead of --targets; default: none)")
    p.add_argument("--top-k-layers", type=positive_int, default=None, help="adapt only the top K transformer layers (shorter backward; default: all)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a method-specific config field, e.g. lora_alpha=16 or share=False (repeatable; default: none)")
    p.add_argument("--procedure", default=None, choices=PROCEDURES,
                   help="a method's training procedure: on top of an adapter (e.g. lmao, car-lora), or with --method full "
                        "for one that trains the model's own weights (default: plain training)")
    p.add_argument("--procedure-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a field of the procedure, e.g. base_lr=1e-6 (repeatable; default: none; "
                        "`rankwise list --procedures` lists them)")
    p.add_argument("--steps", type=positive_int, default=200, help="optimizer steps")
    p.add_argument("--batch-size", type=positive_int, default=16, help="examples per micro-batch (the global batch under torchrun)")
    p.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches accumulated per optimizer step")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate")
    p.add_argument("--decay", default="cosine", choices=DECAYS,
                   help="learning-rate decay after warmup: cosine, linear (to zero) or constant")
    p.add_argument("--weight-decay", type=nonnegative_float, default=0.0, help="decoupled weight decay")
    p.add_argument("--warmup-ratio", type=fraction, default=0.1, help="fraction of the steps spent warming up the learning rate")
    p.add_argument("--seq-len", type=positive_int, default=64, help="tokens per example (LM window / classification truncation)")
    p.add_argument("--train-examples", type=positive_int, default=None, help="use an evenly spaced subset of the training split (default: all of it)")
    p.add_argument("--eval-examples", type=positive_int, default=256, help="held-out examples for the evaluation")
    p.add_argument("--eval-every", type=nonnegative_int, default=0, help="evaluate every N steps (0: only at the end)")
    p.add_argument("--checkpoint-every", type=nonnegative_int, default=50, help="write a checkpoint every N steps (0: none)")
    p.add_argument("--seed", type=int, default=0, help="seeds the adapter initialization, data order and dropout")
    p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --out")
    p.set_defaults(func=run, on_interrupt=interrupted)


def interrupted(args: argparse.Namespace) -> str:
    how = "rerun the same command to resume from it (--no-resume starts over)"
    return checkpoint_note(Path(args.out) / "checkpoint", how)


def check_arguments(args: argparse.Namespace) -> dict:
    """Everything that can be checked before loading a model; returns the parsed --option fields."""
    from rankwise.errors import InvalidInputError

    if args.targets and args.targets_regex:
        raise InvalidInputError("give --targets or --targets-regex, not both")
    full = args.method == FULL
    if full and (args.rank is not None or args.targets or args.targets_regex or args.option or args.top_k_layers):
        raise InvalidInputError("--method full trains every weight: it takes no --rank, --targets, --option or --top-k-layers")
    if not full and args.rank is None:
        raise InvalidInputError(f"--method {args.method} needs --rank")
    if args.optimizer in UNCHECKPOINTABLE_OPTIMIZERS and args.checkpoint_every:
        raise InvalidInputError(
            f"--optimizer {args.optimizer} keeps a projector object in its state, which a checkpoint cannot store: "
            "pass --checkpoint-every 0 (no checkpoints, so no resume), or use --optimizer lora-pre"
        )
    entry = task_entries()[args.task]
    info = require_model(args.model, "finetune", ACCEPTS, causal=entry.causal)
    check_optimizer(args, full, folders.model_dims(info))
    if entry.inputs == "text":
        folders.check_sequence_length(info, args.seq_len)
    if folders.model_inputs(info) != entry.inputs:
        raise InvalidInputError(f"--task {args.task} reads {entry.inputs} and --model {args.model} reads "
                                f"{folders.model_inputs(info)}: pick a task for that model (`rankwise finetune --help`)")
    check_output(args.out, run="finetune", sources=() if args.model in folders.EMBEDDED_MODELS else (args.model,))
    if args.model not in folders.EMBEDDED_MODELS and Path(args.model).resolve() in Path(args.out).resolve().parents:
        # the run would add files to the base it trains, whose recorded content digest would then be stale
        raise InvalidInputError(f"--out {args.out} lies inside --model {args.model}: a run must not write into the model "
                                "it trains; choose an output folder outside it")
    options = parse_key_values(args.option)
    if args.procedure_option and not args.procedure:
        raise InvalidInputError("--procedure-option needs --procedure")
    if args.procedure:
        from rankwise.core.training import TrainConfig
        from rankwise.training.procedures import check_procedure_options, check_procedure_run, check_trains

        check_trains(args.procedure, full, args.method)
        # Names, types and what needs no model, now, and what the procedure's class and engine say of this run
        # (checkpoints, the federated job); what depends on the module (layer indices, the adapter's choices) when
        # the builder runs, after the model is loaded.
        config = check_procedure_options(args.procedure, parse_key_values(args.procedure_option, "--procedure-option"))
        settings = TrainConfig(steps=args.steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
                               weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio, decay=args.decay,
                               eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed)
        check_procedure_run(args.procedure, config, settings, entry.kind)
    if not full:
        from rankwise.adapters import build_config

        # The whole config, checked now (option names, types, values) rather than after the model is loaded.
        targets = args.targets_regex or ([t.strip() for t in args.targets.split(",") if t.strip()] if args.targets else ["default"])
        build_config(args.method, args.rank, targets, None, **options).validate()
    return options


def check_optimizer(args: argparse.Namespace, full: bool, dims: dict[str, int]) -> None:
    """--optimizer and --optimizer-rank, before any work: a rank goes only with a low-rank-state optimizer, which needs
    one, keeps states of full weight matrices (an adapter method freezes them) and cannot exceed the smaller side of
    the model's smallest matrix (`dims`: the model's config sizes, when known)."""
    from rankwise.errors import InvalidInputError
    from rankwise.registry.tables import optimizer_entries

    entries = optimizer_entries()
    rank, name = args.optimizer_rank, args.optimizer
    if not entries[name].low_rank:
        if rank is not None:
            low = ", ".join(sorted(n for n, e in entries.items() if e.low_rank))
            raise InvalidInputError(f"--optimizer-rank {rank}: --optimizer {name} keeps full-size states and takes no rank; "
                                    f"drop --optimizer-rank, or choose a low-rank-state optimizer ({low})")
        return
    if rank is None:
        raise InvalidInputError(f"--optimizer {name} needs a rank (--optimizer-rank R, e.g. 8)")
    if not full:
        raise InvalidInputError(f"--optimizer {name} keeps low-rank states of full weight matrices, which --method "
                                f"{args.method} freezes (only its adapter trains): use it for full fine-tuning "
                                "(--method full), or train the adapter with --optimizer adamw")
    side = folders.smallest_matrix_side(dims)
    if side is not None and rank > side:
        raise InvalidInputError(f"--optimizer-rank {rank} exceeds the smaller side ({side}) of {args.model}'s smallest "
                                f"weight matrix, which the optimizer factors: choose --optimizer-rank at most {side}")


OUTPUTS = ("adapter", "model", "head.safetensors")  # what a run writes besides metrics.json and checkpoint/


def drop_earlier_outputs(out: Path, written: set[str]) -> None:
    """Remove the outputs an earlier run in this folder wrote and this one did not (an adapter/ left beside a full
    fine-tune's model/ would be read as this run's by `rankwise info` and `eval`). Only finetune's own names, in a
    folder that carries finetune's run marker."""
    import shutil

    for name in sorted(set(OUTPUTS) - written):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_file() or path.is_symlink():
            path.unlink()


def resolved_options(method: str, rank: int, options: dict) -> dict:
    """Every option of `method`'s config, the given ones and the defaults (what the run record compares on resume)."""
    import dataclasses

    from rankwise.adapters import build_config

    config = build_config(method, rank, ["default"], None, **options)
    set_by_flags = {"r", "target_modules", "layers_to_transform"}  # --rank, --targets, --top-k-layers: recorded apart
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in set_by_flags}


def run(args: argparse.Namespace) -> int:
    options = check_arguments(args)  # before the heavy imports: a bad argument answers at once
    from rankwise.adapters import adapt, adapter_type
    from rankwise.core.io import save_model_folder, save_tensors_atomic, write_json_atomic
    from rankwise.core.progress import say, set_quiet
    from rankwise.core.seed import set_seed
    from rankwise.data import token_windows
    from rankwise.errors import InvalidInputError
    from rankwise.models import load_model
    from rankwise.core.training import TrainConfig, distributed, summary
    from rankwise.optim import optimizer_state_bytes
    from rankwise.registry import resolve
    from rankwise.training.optimizers import optimizer_factory
    from rankwise.training.procedures import build_procedure, run_procedure
    from rankwise.training.tasks import TaskRequest

    full = args.method == FULL
    make_optimizer = optimizer_factory(args.optimizer, args.optimizer_rank)
    base = folders.base_identity(args.model)  # before training: the folder as it is now is the one trained on
    out = Path(args.out)
    mark_run_folder(out, "finetune")
    owns_group = not distributed.is_initialized()
    distributed.init_distributed()  # under torchrun: join the group (train() would too), so rank 0 can go first
    main = distributed.is_main_process()
    if not main:
        set_quiet(True)  # one log, one set of progress bars: rank 0's
    set_seed(args.seed)
    with distributed.main_process_first():  # rank 0 builds the caches (model, tokens, statistics), the others read them
        model, tokenizer = load_model(args.model)
        entry = task_entries()[args.task]
        if entry.causal and not hasattr(model, "lm_head"):
            raise InvalidInputError(f"--task {args.task} needs a causal language model (e.g. smollm2-135m), not {args.model}")
        request = TaskRequest(tokenizer, args.seq_len, getattr(model, "image_size", None), args.train_examples,
                              args.eval_examples, args.seed)
        task = resolve(entry.builder)(request)
        if full:
            adapted = model.requires_grad_(True)
            say(f"full fine-tuning of {args.model}: {sum(p.numel() for p in model.parameters()):,} parameters")
        else:
            targets = args.targets_regex or ([t.strip() for t in args.targets.split(",") if t.strip()] if args.targets else None)
            # Calibration data (disjoint from train and eval) only for methods that build from input statistics.
            needs = adapter_type(args.method).needs_statistics
            if needs and tokenizer is None:
                raise InvalidInputError(f"--method {args.method} builds from calibration statistics of text inputs; "
                                        f"on an image model use an adapter that does not (e.g. lora)")
            calibration = list(token_windows(tokenizer, "calibration", args.seq_len, 32).split(8)) if needs else None
            adapted = adapt(model, args.method, args.rank, targets, args.top_k_layers, calibration, **options)
            say(f"{args.method} r={args.rank} on {args.model}: {adapted.count_parameters()}")
        module = task.wrap(adapted)
        procedure = None
        if args.procedure:
            procedure_options = parse_key_values(args.procedure_option, "--procedure-option")
            procedure = build_procedure(args.procedure, module, task, args.seed, **procedure_options)
            if full:  # a base-training procedure (WASI, TraDy, DFA) may freeze or factor what --method full trains
                trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
                say(f"--procedure {args.procedure}: {trained:,} of {sum(p.numel() for p in module.parameters()):,} "
                    "parameters trained")
    config = TrainConfig(
        steps=args.steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr, weight_decay=args.weight_decay,
        warmup_ratio=args.warmup_ratio, decay=args.decay, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed,
    )
    # Everything the model and data were built from: resuming a checkpoint written with other values is refused. The
    # base by absolute path and content (a folder replaced at the same path is another model), the adapter's options
    # with their defaults filled in (an option given at its default value is the same run as one left out).
    run_config = {"model": base.name, "model_sha256": base.sha256, "method": args.method, "rank": args.rank,
                  "optimizer_rank": args.optimizer_rank, "targets": args.targets, "targets_regex": args.targets_regex,
                  "top_k_layers": args.top_k_layers, "seq_len": args.seq_len, "train_examples": args.train_examples,
                  "eval_examples": args.eval_examples,
                  **{f"option {k}": v for k, v in sorted(({} if full else resolved_options(args.method, args.rank, options)).items())}}
    # The loop, or the engine the procedure runs on (a federated job is run whole: no resume, no optimizer choice).
    loop_only = {"resume": not args.no_resume, "optimizer": make_optimizer} if procedure is None or procedure.runs_on == "loop" else {}
    result = run_procedure(procedure, module, task, config, out_dir=out, run_config=run_config, **loop_only)
    adapter_params = None if full else adapted.count_parameters().trainable
    what = "model" if full else f"{adapter_params:,} adapter parameters"
    # A procedure that trains the base weights too (LMAO) writes them as DIR/model, the adapter's base.
    changes_base = procedure is not None and procedure.changes_base
    base_name = str((out / "model").resolve()) if changes_base else base.name
    if main:  # every rank holds the same trained weights; one writes them
        if full or changes_base:
            from rankwise.adapters.model import base_model_copy

            saved = adapted if full else base_model_copy(adapted)

            def write_model(tmp: Path) -> None:  # model + tokenizer: load_model(DIR/model) reloads it
                if tokenizer is None:  # a vision backbone (no transformers model): its own folder format
                    from rankwise.models.vision import save_backbone

                    save_backbone(saved, tmp)
                    return
                saved.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)

            save_model_folder(out / "model", write_model)
        base_sha256 = folders.base_identity(base_name).sha256 if changes_base else base.sha256
        if full:
            pass  # no adapter: the model folder is the result
        elif module is not adapted:  # a classifier: the head is saved in the adapter, the PEFT way (modules_to_save)
            adapted.save(out / "adapter", base_model_name_or_path=base_name, prefix="model.", modules_to_save={"head": module.head},
                          base_sha256=base_sha256)
        else:
            adapted.save(out / "adapter", base_model_name_or_path=base_name, base_sha256=base_sha256)
        if full and module is not adapted:
            save_tensors_atomic(out / "head.safetensors", {k: v for k, v in module.head.state_dict().items()})
        written = {"model"} if full or changes_base else set()
        written |= set() if full else {"adapter"}
        written |= {"head.safetensors"} if full and module is not adapted else set()
        drop_earlier_outputs(out, written)
        trainable_total = sum(p.numel() for p in module.parameters() if p.requires_grad)
        write_json_atomic(out / "metrics.json", {
            "model": args.model, "task": args.task, "method": args.method, "rank": args.rank,
            "optimizer": args.optimizer, "optimizer_rank": args.optimizer_rank, "optimizer_state_bytes": optimizer_state_bytes(result.optimizer),
            "adapter_parameters": adapter_params, "trainable_parameters": trainable_total, **summary(result),
        })
        metric = task.metric
        label = "full" if full else f"{args.method} r={args.rank}"
        ranks = f" on {result.world_size} processes" if result.world_size > 1 else ""
        print(f"{label} ({args.optimizer}): {metric} {result.final[metric]:.4f} after {result.steps} steps{ranks} ({what}); wrote {out}")
    if owns_group:
        distributed.shutdown()  # waits for rank 0's writes, then closes the group this command opened
    else:
        distributed.barrier()
    return 0
