import pytest

from rankwise.cli import main


def test_list_shows_38_rows(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "38 methods" in out
    assert sum(1 for line in out.splitlines() if line.split() and line.split()[0] in {
        "care-mla", "pica", "lora-pre", "wasi", "microscaling-ue5m3"}) == 5
    assert main(["list", "--markdown"]) == 0
    assert capsys.readouterr().out.count("\n| `") == 38


def test_unknown_reproduction_is_a_clear_error(capsys):
    assert main(["repro", "no-such-method"]) == 2
    assert "unknown method" in capsys.readouterr().err


@pytest.mark.real_model
def test_eval_ppl_on_smollm2(capsys):
    assert main(["--quiet", "eval", "ppl", "--model", "smollm2-135m", "--max-windows", "2", "--seq-len", "256"]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_threads_option_sets_torch_threads_and_rejects_zero(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["--threads", "1", "list"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert main(["--threads", "0", "list"]) == 2
    assert "--threads must be at least 1" in capsys.readouterr().err


def test_global_threads_reaches_subcommands():
    """A subcommand must not shadow the global --threads (finetune once had its own flag that reset it to None)."""
    from rankwise.cli import build_parser

    args = build_parser().parse_args(["--threads", "1", "finetune", "--model", "m", "--task", "wiki-lm", "--method", "full", "--out", "o"])
    assert args.threads == 1
