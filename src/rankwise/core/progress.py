"""Progress bars that one switch silences (`--quiet`, or RANKWISE_QUIET=1)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
_quiet = os.environ.get("RANKWISE_QUIET", "") not in ("", "0")


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet
    if quiet:  # transformers draws its own bars (weight loading); silence those too
        if "transformers" not in sys.modules:
            # Not imported yet (the CLI starts without it): it reads this at import, so no import is needed now.
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
            return
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def is_quiet() -> bool:
    return _quiet


def progress(iterable: Iterable[T] | None = None, desc: str = "", total: int | None = None, **kwargs) -> tqdm:
    """A tqdm bar on stderr, disabled when quiet."""
    return tqdm(iterable, desc=desc, total=total, disable=_quiet, leave=False, dynamic_ncols=True, **kwargs)


def say(*args) -> None:
    """Print a status line unless quiet."""
    if not _quiet:
        print(*args, flush=True)
