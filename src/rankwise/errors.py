"""Error types. Every error a user can cause is a `RankwiseError` whose message says what was wrong and what to do."""


class RankwiseError(Exception):
    """Base class of all errors rankwise raises on purpose."""


class InvalidInputError(RankwiseError, ValueError):
    """An argument, model or dataset that the called function cannot work with."""


class MissingPackageError(RankwiseError, ImportError):
    """A data or model package is not installed; the message names the install command."""


class CorruptFileError(RankwiseError, OSError):
    """A file on disk is truncated, altered or not what it claims to be."""


class NumericalError(RankwiseError, FloatingPointError):
    """NaN or Inf appeared where finite numbers are required."""


class UnknownNameError(RankwiseError, KeyError):
    """A model, method, task or format name that rankwise does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly instead.
        return str(self.args[0]) if self.args else ""
