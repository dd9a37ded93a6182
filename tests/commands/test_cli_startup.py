"""Issue 17, items 11 and 12: the command starts fast (no torch at start-up), `python -m rankwise` and `--version`
work, and every flag of every command has a help text that shows its default."""

import argparse
import subprocess
import sys

import pytest

from rankwise.cli import HelpFormatter, build_parser

PROBE = """
import sys
from rankwise.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "peft", "safetensors", "numpy") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def _probe(*argv):
    return subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0),
    (["list"], 0),
    (["finetune", "--help"], 0),
    (["convert", "mla", "--help"], 0),
    (["finetune", "--model", "x"], 2),  # missing required arguments
    (["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
      "--out", "o", "--train-examples", "0"], 2),
    (["eval", "ppl", "--model", "smollm2-135m", "--batch-size", "0"], 2),
    (["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "8", "--damping", "nan"], 2),
    (["no-such-command"], 2),
])
def test_help_list_and_argument_errors_import_no_heavy_module(argv, code):
    """Start-up imports only the registry and the command parsers: torch is imported by a command's run, not before."""
    result = _probe(*argv)
    assert result.returncode == code, result.stderr
    assert "HEAVY=\n" in result.stderr or result.stderr.rstrip().endswith("HEAVY="), result.stderr
    assert "Traceback" not in result.stderr


def test_python_dash_m_and_version():
    result = subprocess.run([sys.executable, "-m", "rankwise", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("rankwise ")
    from rankwise import __version__

    assert __version__ in result.stdout
    result = subprocess.run([sys.executable, "-m", "rankwise", "list"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "38 methods" in result.stdout


def _all_parsers(parser, name="rankwise"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _all_parsers(sub, f"{name} {sub_name}")


def test_every_flag_has_help_and_shows_its_default():
    """Walks the whole parser: each option has help, and its formatted help names its default (or what no value means)."""
    missing, no_default = [], []
    for name, parser in _all_parsers(build_parser()):
        assert isinstance(parser.formatter_class, type) and issubclass(parser.formatter_class, HelpFormatter), name
        formatter = parser.formatter_class(name)
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(label)
                continue
            takes_value = action.option_strings and action.nargs != 0 and not action.required
            if takes_value and "default" not in formatter._get_help_string(action).lower():
                no_default.append(label)
    assert not missing, f"flags without help: {missing}"
    assert not no_default, f"optional flags whose help shows no default: {no_default}"


def test_choices_are_their_sources():
    """The parsers' name tables, derived without importing torch (registry records, source literals), equal the
    libraries' own tables."""
    from rankwise.adapters import available_methods
    from rankwise.commands import choices
    from rankwise.compress.mla.allocation import ALLOCATIONS, SCORES
    from rankwise.compress.mla.calibration import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN
    from rankwise.compress.mla.factorize import ALIASES, METHODS
    from rankwise.compress.mla_deploy.rope import SELECTIONS
    from rankwise.core.training.schedule import DECAYS
    from rankwise.registry.tables import optimizer_entries, procedure_entries
    from rankwise.training.optimizers import optimizer_factory

    assert choices.MLA_METHODS == tuple(sorted([*METHODS, *ALIASES]))
    assert choices.MLA_ALLOCATIONS == ALLOCATIONS and choices.MLA_SCORES == SCORES
    assert (choices.MLA_CALIB_SAMPLES, choices.MLA_CALIB_SEQ_LEN) == (DEFAULT_SAMPLES, DEFAULT_SEQ_LEN)
    assert choices.ROPE_SELECTIONS == tuple(sorted(SELECTIONS))
    assert choices.ADAPTER_METHODS == tuple(available_methods())
    assert choices.OPTIMIZERS == tuple(sorted(optimizer_entries()))
    assert choices.PROCEDURES == tuple(sorted(procedure_entries()))
    assert choices.DECAYS == DECAYS
    assert set(choices.UNCHECKPOINTABLE_OPTIMIZERS) <= set(choices.OPTIMIZERS)
    for name, entry in optimizer_entries().items():  # every named optimizer builds
        assert callable(optimizer_factory(name, 4 if entry.low_rank else None))


def test_a_literal_is_read_from_source_and_a_missing_one_is_refused():
    from rankwise.targets import literal

    assert literal("rankwise.core.training.schedule:DECAYS") == ("cosine", "linear", "constant")
    with pytest.raises(LookupError):
        literal("rankwise.core.training.schedule:NO_SUCH_NAME")


def test_output_into_a_closed_pipe_is_not_a_traceback():
    """`rankwise list | head -0`: the reader has closed the pipe; no BrokenPipeError traceback, exit 141."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "rankwise", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the read end is gone before the first write: every write fails with EPIPE
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode == 141
