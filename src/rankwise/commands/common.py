"""What every command checks before any work: argument values, output paths, and which `--model` kinds it takes.

Kept light (no torch, no transformers): these run at parse time or first thing in a command, so a bad argument
answers in milliseconds, and never after a long computation.

- argparse types (`positive_int`, `nonnegative_float`, ...): a bad value is an argparse error naming the flag;
- `check_output(path, flag)`: the output can be written (its names and path within the system's limits, not `.`,
  not under a file, the nearest existing folder is writable, an existing folder is one this output may replace) —
  found before training, not after;
- `require_model(value, command, accepts)`: the embedded model or folder is a kind the command takes; any other of
  rankwise's folder kinds is refused with what to pass instead (`rankwise.models.folders` tells the kinds apart).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from rankwise.core.path_limits import CONTENT_MARGIN, check_path_limits, shown
from rankwise.errors import InvalidInputError
from rankwise.models import folders


# -- argparse types: a bad value is reported by argparse as "argument --flag: ..." -------------------------------------
def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], got {text!r}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


# -- outputs ------------------------------------------------------------------------------------------------------
RUN_MARKER = "rankwise-run.json"  # written first into a training run's --out folder: "this folder is a rankwise run"


def check_output(path: str | os.PathLike, flag: str = "--out", folder: bool = True, kind: str | None = None,
                 overwrite: bool = False, run: str | None = None, sources: tuple[str, ...] = (),
                 checkpoints: bool = False) -> Path:
    """Refuse an output that cannot be written, before any work. Returns the path.

    Refused: the current folder or one above it (a folder output replaces its target), a path under an existing
    file, a path whose nearest existing folder cannot be written (probed by creating and removing a temporary folder
    there, which also catches read-only mounts and /sys for root), and for a folder output an existing file.
    Nothing is left behind by the check. What an existing folder may hold depends on what is written there:
    - `kind` (a folder written whole by `core.io.save_model_folder`): empty, or rankwise's own of that kind, or
      `overwrite`;
    - `run` (the command, e.g. "finetune", whose training run folder it is): empty, or one of that command's runs
      (it has the `RUN_MARKER` that `mark_run_folder` writes). Such a command writes several entries there
      (metrics.json, checkpoint/, adapter/, ...) and resumes from them, so a user's own files there (their
      metrics.json) would be overwritten;
    - `checkpoints` (a training loop's checkpoint folder, e.g. `--heal-dir`): empty, or holding only the loop's
      `checkpoint/`, a rankwise training checkpoint, which it resumes and replaces (`check_checkpoint_folder`).
    """
    path = Path(path)
    # Names and the path within the system's limits, before anything looks at the path (a name over NAME_MAX makes
    # every stat raise). An output rankwise writes whole (`kind`) or as one file goes through an atomic temporary
    # beside it, whose longer name must fit as well; a folder output needs room below it for its files.
    check_path_limits(path, f"{flag} {shown(path)}", temporary_sibling=kind is not None or not folder,
                      content_margin=CONTENT_MARGIN if folder else 0)
    resolved = path.expanduser().resolve()
    for source in sources:  # what the command reads (e.g. --model DIR): replacing the output must not delete it
        src = Path(source).expanduser()
        if os.path.exists(src) and (src.resolve() == resolved or resolved in src.resolve().parents):
            raise InvalidInputError(f"{flag} {path} holds the input {source}: writing there would replace what the command "
                                    f"reads; choose an output folder outside it")
    cwd = Path.cwd().resolve()
    if folder and (resolved == cwd or resolved in cwd.parents):
        raise InvalidInputError(
            f"{flag} {path} is the current folder or one above it; rankwise writes its output folder as a whole: "
            f"name a new folder, e.g. {flag} {path / 'out'}"
        )
    if folder and resolved.is_file():
        raise InvalidInputError(f"{flag} {path} is an existing file; rankwise writes a folder there: choose another path")
    if not folder and resolved.is_dir():
        raise InvalidInputError(f"{flag} {path} is a folder; it names a file to write")
    existing = resolved.parent if not resolved.exists() or not folder else resolved
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidInputError(f"{flag} {path} lies under {existing}, which is a file, not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".rankwise-write-check.", dir=existing)
    except OSError as e:
        raise InvalidInputError(f"{flag} {path}: cannot write in {existing} ({e.strerror or e}); choose a writable folder") from None
    os.rmdir(probe)
    if kind is not None:
        from rankwise.core.io import check_output_folder  # imports torch: only once the command runs

        check_output_folder(path, kind, overwrite)
    if run is not None and folder and resolved.is_dir() and any(resolved.iterdir()) and not (resolved / RUN_MARKER).is_file():
        raise InvalidInputError(
            f"{flag} {path} already holds files that no `rankwise {run}` run wrote (no {RUN_MARKER}); it writes "
            "metrics.json, checkpoint/ and its outputs there: name a new or empty folder"
        )
    if checkpoints and folder and resolved.is_dir():
        check_checkpoint_folder(path, flag)
    return path


CHECKPOINT_NAME = "checkpoint"  # what the training loop writes in its folder (core.training.loop: out_dir/checkpoint)


def check_checkpoint_folder(path: Path, flag: str) -> None:
    """Refuse a training loop's checkpoint folder (e.g. `--heal-dir DIR`) that holds anything but what the loop
    writes there: its `checkpoint/` (a rankwise training checkpoint, which the loop resumes and then replaces) and
    that folder's write temporaries. A user's files there would be mixed with, or replaced by, the checkpoints."""
    import re

    from rankwise.core.io import KIND_KEY, MANIFEST_NAME
    from rankwise.core.training.checkpoint import KIND  # imports torch: only for a folder that already holds files

    temporary = re.compile(rf"^\.{CHECKPOINT_NAME}\.rw\d+@.*\.(tmp|old)$")  # core.temp_names: a killed write's leftovers
    foreign = sorted(p.name for p in path.iterdir() if p.name != CHECKPOINT_NAME and not temporary.match(p.name))
    advice = (f"name a new or empty folder, or the {flag} of an earlier run of this command (it resumes from the "
              f"{CHECKPOINT_NAME}/ there)")
    if foreign:
        raise InvalidInputError(f"{flag} {path} already holds files that rankwise did not write there "
                                f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); it keeps only its "
                                f"{CHECKPOINT_NAME}/ in that folder: {advice}")
    checkpoint = path / CHECKPOINT_NAME
    if not checkpoint.exists():
        return
    try:
        import json

        manifest = json.loads((checkpoint / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    found = manifest.get(KIND_KEY, KIND if (checkpoint / "trainer.json").is_file() else None) if isinstance(manifest, dict) else None
    if found != KIND:  # (a manifest without a kind: written before kinds were recorded, a checkpoint if it has trainer.json)
        raise InvalidInputError(f"{flag} {path}: its {CHECKPOINT_NAME}/ is not a rankwise training checkpoint (no "
                                f"{MANIFEST_NAME} of kind {KIND!r}); rankwise would replace it with its own: {advice}")


def mark_run_folder(path: str | os.PathLike, command: str) -> None:
    """Create the run folder and its marker (before the first checkpoint or output is written)."""
    from rankwise.core.io import write_json_atomic

    folder = Path(path).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / RUN_MARKER).is_file():
        write_json_atomic(folder / RUN_MARKER, {"rankwise_run": command})


# -- models -------------------------------------------------------------------------------------------------------
# What to tell a user whose folder a command does not take, by kind (the command's name is filled in).
_REFUSALS = {
    folders.MLA_ONESHOT: "{command} does not take a one-shot MLA conversion (its K/V projections are low-rank factor "
                         "pairs): pass the original model, or evaluate it with `rankwise eval ppl`",
    folders.MLA_DEPLOY: "{command} does not take a deployable MLA (DeepSeek-V3) model: pass the original model",
    folders.QUANTIZED: "{command} does not take a block-quantized folder: pass the unquantized model",
    folders.ADAPTER: "{command} does not take an adapter folder: pass its base model ({base})",
    folders.FINETUNE_RUN: "{command} takes a model, not a finetune run folder: pass {inner}",
    folders.CHECKPOINT: "{command} takes a model, not a training checkpoint: rerun the command that wrote it to resume",
    folders.MODEL: "{command} does not take this model",
}


def require_model(value: str, command: str, accepts: frozenset[str] | set[str], causal: bool = False,
                  model_types: tuple[str, ...] | None = None) -> folders.FolderInfo:
    """The kind of `--model VALUE` if `command` takes it; else a RankwiseError saying what to pass instead.

    accepts: kinds from `rankwise.models.folders` (EMBEDDED, MODEL, ...); causal: require a causal LM;
    model_types: require one of these transformers model types (e.g. Llama-family for MLA conversion).
    """
    info = folders.identify(value)
    if info.kind not in accepts:
        inner = " or ".join(str(Path(value) / p) for p in ("adapter", "model") if (Path(value) / p).is_dir()) or "a model"
        why = _REFUSALS[info.kind].format(command=command, base=info.base or "recorded nowhere", inner=inner)
        raise InvalidInputError(f"--model {value}: {info.summary}. {why}")
    if causal and info.causal is False:
        raise InvalidInputError(f"--model {value}: {info.summary}. {command} needs a causal language model (e.g. smollm2-135m)")
    if model_types and info.model_type is not None and info.model_type not in model_types:
        raise InvalidInputError(f"--model {value}: {info.summary}. {command} supports model types {', '.join(model_types)} only")
    return info


def add_model_argument(p: argparse.ArgumentParser, what: str = "smollm2-135m, minilm-l6, or a saved transformers folder") -> None:
    p.add_argument("--model", required=True, help=f"{what} (`rankwise info DIR` says what a folder is)")


# -- interrupts ---------------------------------------------------------------------------------------------------
def checkpoint_note(folder: Path, how_to_resume: str) -> str:
    """After Ctrl-C: where the last complete checkpoint is (its step, read from trainer.json) and how to resume."""
    trainer = folder / "trainer.json"
    if not trainer.is_file():
        return f"No checkpoint was written yet ({folder} does not exist): run the command again to start over."
    try:
        import json

        step = json.loads(trainer.read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    at = f" at step {step}" if step is not None else ""
    return f"The last complete checkpoint{at} is in {folder}: {how_to_resume}."
