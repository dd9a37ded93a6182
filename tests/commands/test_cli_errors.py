"""Issue 17, items 7-10: errors found before any work, each a one-line `rankwise: error: ...` (exit 2), never a raw
traceback; Ctrl-C says where the last checkpoint is and how to resume (exit 130). Plus the library-level checks the
CLI relies on (the same bad values refused by the Python API)."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

import rankwise.models
from rankwise.cli import main
from rankwise.commands.common import check_output
from rankwise.errors import InvalidInputError

FINETUNE = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2"]


class Worked(Exception):
    """Raised by the patched load_model: the command went past its checks into real work."""


@pytest.fixture
def no_work(monkeypatch):
    """Any command that reaches load_model fails the test: the error had to come before any work."""

    def load_model(*args, **kwargs):
        raise Worked

    monkeypatch.setattr(rankwise.models, "load_model", load_model)


def _error(capsys, argv) -> str:
    """Run the CLI; it must exit 2 with one clean error line (argparse's or ours) and no traceback."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "error:" in err
    return err


# -- item 7: outputs checked before any work ----------------------------------------------------------------------
def test_out_is_validated_before_training(tmp_path, capsys, no_work, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    monkeypatch.chdir(tmp_path)
    assert "is an existing file" in _error(capsys, [*FINETUNE, "--out", str(a_file)])
    assert "which is a file" in _error(capsys, [*FINETUNE, "--out", str(a_file / "sub")])
    assert "current folder" in _error(capsys, [*FINETUNE, "--out", "."])
    assert "current folder" in _error(capsys, ["quantize", "--model", "minilm-l6", "--out", ".."])
    assert a_file.read_text() == "mine"  # nothing touched


def test_unwritable_out_is_refused(tmp_path):
    if Path("/sys").is_dir() and not os.access("/sys", os.W_OK):
        with pytest.raises(InvalidInputError, match="cannot write"):
            check_output("/sys/x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions: /sys (sysfs) covered it above
            pytest.skip("running as root: permission bits do not stop writes")
        with pytest.raises(InvalidInputError, match="cannot write"):
            check_output(locked / "out")
    finally:
        locked.chmod(0o700)
    assert list(locked.iterdir()) == []  # the probe leaves nothing


def test_a_writable_new_out_passes_and_leaves_nothing(tmp_path):
    assert check_output(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []


# -- item 8: bad values are argument errors, not ZeroDivisionError or TypeError -----------------------------------
@pytest.mark.parametrize("extra, says", [
    (["--train-examples", "0"], "--train-examples"),
    (["--eval-examples", "0"], "--eval-examples"),
    (["--steps", "0"], "--steps"),
    (["--lr", "nan"], "--lr"),
    (["--option", "lora_alpha=abc"], "lora_alpha must be float"),
    (["--option", "r=16"], "--rank"),
    (["--option", "nope=1"], "no option(s) ['nope']"),
])
def test_finetune_bad_values(extra, says, tmp_path, capsys, no_work):
    assert says in _error(capsys, [*FINETUNE, "--out", str(tmp_path / "o"), *extra])


def test_eval_ppl_bad_values(capsys, no_work):
    assert "--batch-size" in _error(capsys, ["eval", "ppl", "--model", "smollm2-135m", "--batch-size", "0"])
    assert "causal language model" in _error(capsys, ["eval", "ppl", "--model", "minilm-l6"])


# -- item 9 -------------------------------------------------------------------------------------------------------
def test_convert_mla_names_the_damping_flag(capsys, no_work):
    err = _error(capsys, ["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "48", "--damping", "nan"])
    assert "--damping" in err


def test_galore_with_checkpoints_is_refused_up_front_naming_the_flag(tmp_path, capsys, no_work):
    argv = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "full", "--optimizer", "galore",
            "--optimizer-rank", "4", "--out", str(tmp_path / "o")]
    assert "--checkpoint-every 0" in _error(capsys, argv)
    with pytest.raises(Worked):  # without checkpoints it is accepted
        main([*argv, "--checkpoint-every", "0"])


# -- the shared error path ------------------------------------------------------------------------------------------
def test_rankwise_errors_become_one_line(capsys):
    assert main(["repro", "no-such-method"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankwise: error: unknown method") and "Traceback" not in err


# -- item 10: Ctrl-C ------------------------------------------------------------------------------------------------
def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_resume(tmp_path, capsys, monkeypatch):
    import rankwise.commands.finetune as finetune

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune, "check_arguments", interrupted)
    out = tmp_path / "run"
    assert main([*FINETUNE, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "No checkpoint was written yet" in err and "Traceback" not in err
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "trainer.json").write_text(json.dumps({"step": 40}))
    assert main([*FINETUNE, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"at step 40 is in {out / 'checkpoint'}" in err and "rerun the same command to resume" in err


def test_ctrl_c_in_a_command_without_checkpoints(capsys, monkeypatch):
    import rankwise.commands.repro as repro

    def interrupted(target):
        raise KeyboardInterrupt

    monkeypatch.setattr(repro, "parse_target", interrupted)
    assert main(["repro", "pica"]) == 130
    assert "interrupted" in capsys.readouterr().err


# -- the library refuses the same values (item 8, 9) ----------------------------------------------------------------
@pytest.mark.method("microscaling-ue5m3")
def test_quantize_an_empty_tensor():
    from rankwise.quant import make_recipe
    from rankwise.quant.block import quantize

    with pytest.raises(InvalidInputError, match="empty tensor"):
        quantize(torch.empty(0, 8), make_recipe("fp4", "ue5m3", 8))


def test_perplexity_refuses_an_encoder_and_batch_size_zero():
    from rankwise.eval import perplexity
    from rankwise.models import tiny_bert, tiny_llama

    windows = torch.randint(0, 100, (2, 8))
    with pytest.raises(InvalidInputError, match="causal language model"):
        perplexity(tiny_bert(), windows)
    with pytest.raises(InvalidInputError, match="batch_size"):
        perplexity(tiny_llama(), windows, batch_size=0)


@pytest.mark.method("lora-pre")
@pytest.mark.parametrize("field", ["lr", "eps", "weight_decay"])
def test_lora_pre_refuses_nan_hyperparameters(field):
    from rankwise.optim import LoRAPre

    w = torch.nn.Parameter(torch.randn(6, 4))
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(InvalidInputError, match=field):
            LoRAPre([{"params": [w], "rank": 2}], **{field: bad})
    assert torch.isfinite(w).all()


@pytest.mark.method("care-mla")
def test_mla_refuses_nan_damping_and_a_latent_cache_larger_than_the_original():
    from rankwise.compress.mla import convert_to_mla
    from rankwise.compress.mla_deploy import convert_to_deployable_mla
    from rankwise.models import tiny_llama

    calib = torch.randint(0, 2000, (4, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(InvalidInputError, match="damping must be a finite number"):
        convert_to_mla(tiny_llama(), 8, "care", calibration=calib, damping=math.nan)
    with pytest.raises(InvalidInputError, match="damping must be a finite number"):
        convert_to_deployable_mla(tiny_llama(), 8, 8, calibration=calib, damping=math.nan)


@pytest.mark.method("care-mla")
def test_convert_mla_deploy_refuses_a_latent_cache_larger_than_the_original(tmp_path, capsys, tokenizer, monkeypatch):
    """tiny_llama: 2 KV heads x 16 = 32 wide, so GQA caches 64 numbers per token and layer; 2 x 30 + 8 = 68 > 64.
    (The library allows it, for full-rank parity checks; the command, whose point is the saving, refuses it.)"""
    import rankwise.compress.mla_deploy.build as build
    from rankwise.models import tiny_llama

    source = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(source)
    tokenizer.save_pretrained(source)

    def calibrated(*args, **kwargs):
        raise AssertionError("refused only after the conversion started")

    monkeypatch.setattr(build, "kv_input_moments", calibrated)
    argv = ["convert", "mla", "--model", str(source), "--deploy", "--kv-rank", "30", "--rope-dims", "8", "--eval-windows", "0"]
    assert "more than the original" in _error(capsys, argv)


@pytest.mark.real_model
@pytest.mark.method("care-mla")
def test_deploy_with_a_larger_cache_is_refused_before_calibration(capsys):
    """`convert mla --deploy --kv-rank 180` on SmolLM2 (KV width 192, rope 32: 392 > 384) reported 'saving -2.1%'."""
    assert "more than the original" in _error(capsys, ["convert", "mla", "--model", "smollm2-135m", "--deploy",
                                                        "--kv-rank", "180", "--eval-windows", "0"])


def test_out_holding_user_files_is_refused_up_front_unless_overwrite(tmp_path, capsys, no_work):
    """The folder writer's refusal (core.io) is checked before any work; --overwrite passes the consent through."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["quantize", "--model", "minilm-l6", "--out", str(out)]
    assert "--overwrite" in _error(capsys, argv)
    with pytest.raises(Worked):
        main([*argv, "--overwrite"])
    assert (out / "notes.txt").read_text() == "mine"


def test_repro_out_never_overwrites_a_users_report(tmp_path, capsys, tmp_cache, monkeypatch):
    """`repro --out DIR`: DIR is new, empty or an earlier `repro --out` run; a user's own report.md is kept."""
    from rankwise.cli import main
    from rankwise.core.report import Report

    # what is written and where is the command's business, not the experiment's: a one-claim stand-in run
    def quick_run(size, seed):
        report = Report("plop", "stand-in", size, seed)
        report.claim("c", "a stand-in claim", 1.0, ">=", 0.0, kind="sanity")
        return report.finish()

    monkeypatch.setattr("rankwise.repro.plop.main.run", quick_run)

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    assert main(["--quiet", "repro", "plop", "--out", str(mine)]) == 2
    assert (mine / "report.md").read_text() == "my notes"
    out = tmp_path / "run"
    assert main(["--quiet", "repro", "plop", "--out", str(out)]) == 0
    assert main(["--quiet", "repro", "plop", "--out", str(out)]) == 0  # its own run folder is reused
    assert (out / "report.json").is_file()


@pytest.mark.parametrize("command", [["quantize", "--format", "fp4", "--scale", "ue5m3", "--block", "16"],
                                     ["convert", "mla", "--kv-rank", "32", "--method", "svd"]])
def test_overwrite_never_deletes_the_commands_own_input(tmp_path, capsys, command):
    """`--out DIR --overwrite` with --model inside DIR would replace (delete) the input: refused before any work."""
    from rankwise.cli import main
    from rankwise.models import load_smollm2_tokenizer, tiny_llama

    model = tmp_path / "out" / "model"
    tiny_llama(seed=0).save_pretrained(model)
    load_smollm2_tokenizer().save_pretrained(model)
    assert main(["--quiet", *command, "--model", str(model), "--out", str(tmp_path / "out"), "--overwrite"]) == 2
    assert "holds the input" in capsys.readouterr().err
    assert (model / "config.json").is_file()


def test_an_overflowing_option_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import rankwise.models
    from rankwise.cli import main

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    argv = ["--quiet", "finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
            "--option", "lora_alpha=1e999", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "lora_alpha=1e999: the number overflows or is not finite" in capsys.readouterr().err


@pytest.mark.parametrize("argv, context", [
    (["eval", "ppl", "--model", "smollm2-135m", "--seq-len", "100000"], 8192),
    (["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2", "--seq-len", "4096"], 512),
])
def test_a_sequence_beyond_the_models_context_is_refused_before_any_work(tmp_path, capsys, monkeypatch, argv, context):
    import rankwise.models
    from rankwise.cli import main

    monkeypatch.setattr(rankwise.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    out = ["--out", str(tmp_path / "o")] if argv[0] == "finetune" else []
    assert main(["--quiet", *argv, *out]) == 2
    assert f"context of {context} tokens" in capsys.readouterr().err


# -- issue 32, item 13: refused before the model loads, in words that name the flag ---------------------------------
LA_LORA = [*FINETUNE, "--procedure", "la-lora"]


@pytest.mark.method("la-lora")
@pytest.mark.parametrize("option, says", [
    ("start_with=C", "start_with must be 'A' or 'B'"),
    ("local_steps=0", "local_steps must be a positive integer"),
    ("rounds=0", "rounds must be a positive integer"),
    ("clip=0", "clipping norm clip must be positive"),
    ("clients_per_round=9", "clients_per_round must be between 1 and the 4 clients"),
    ("delta=2", "delta must lie in (0, 1)"),
    ("epsilon=-1", "epsilon must be a positive"),
])
def test_la_lora_job_settings_are_refused_before_the_model_loads(option, says, tmp_path, capsys, no_work):
    """Each was refused only by the federated engine, after the model, the task and the adapter were built."""
    err = _error(capsys, [*LA_LORA, "--procedure-option", option, "--out", str(tmp_path / "o")])
    assert says in err and "--procedure la-lora" in err


@pytest.mark.method("la-lora")
def test_la_lora_on_a_language_modelling_task_is_refused_before_the_model_loads(tmp_path, capsys, no_work):
    argv = ["finetune", "--model", "smollm2-135m", "--task", "wiki-lm", "--method", "lora", "--rank", "2",
            "--procedure", "la-lora", "--out", str(tmp_path / "o")]
    assert "text-classification task (e.g. --task wiki-topics)" in _error(capsys, argv)
    with pytest.raises(Worked):  # a valid job passes its checks
        main([*LA_LORA, "--procedure-option", "clients_per_round=2", "--out", str(tmp_path / "ok")])


@pytest.mark.method("la-lora")
def test_a_procedure_given_an_adapter_it_cannot_train_is_refused_before_the_model_loads(tmp_path, capsys, no_work):
    """la-lora alternates LoRA's A and B factors; with another adapter it failed only after the model loaded."""
    argv = ["finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "pica", "--rank", "2",
            "--procedure", "la-lora", "--out", str(tmp_path / "o")]
    assert "trains lora adapters, not --method pica" in _error(capsys, argv)


@pytest.mark.method("coa-lora")
def test_coa_lora_with_the_default_checkpoints_is_refused_up_front_naming_the_flag(tmp_path, capsys, no_work):
    argv = ["finetune", "--model", "smollm2-135m", "--task", "wiki-lm", "--method", "coa-lora", "--rank", "2",
            "--procedure", "coa-lora", "--out", str(tmp_path / "o")]
    err = _error(capsys, argv)  # the default --checkpoint-every 50
    assert "--checkpoint-every 0" in err and "checkpoint_every" not in err
    with pytest.raises(Worked):
        main([*argv, "--checkpoint-every", "0"])


@pytest.mark.parametrize("extra, says", [
    (["--method", "lora", "--rank", "2", "--optimizer-rank", "4"], "--optimizer-rank 4: --optimizer adamw keeps full-size states"),
    (["--method", "full", "--optimizer", "lora-pre", "--optimizer-rank", "193"], "choose --optimizer-rank at most 192"),
    (["--method", "lora", "--rank", "2", "--optimizer", "lora-pre", "--optimizer-rank", "4"], "full fine-tuning (--method full)"),
])
def test_optimizer_rank_misuse_is_refused_before_the_model_loads(extra, says, tmp_path, capsys, no_work):
    """SmolLM2's smallest matrices (k_proj, v_proj: 576 x 3 KV heads x 64) allow rank 192 at most; an adapter method
    freezes the matrices a low-rank-state optimizer factors."""
    argv = ["finetune", "--model", "smollm2-135m", "--task", "wiki-lm", *extra, "--out", str(tmp_path / "o")]
    assert says in _error(capsys, argv)


def test_optimizer_rank_is_bounded_by_a_folders_config(tmp_path, capsys, no_work, tokenizer):
    """A plain folder's sizes come from its config.json: tiny_llama's K/V projections are 64 x (2 x 16)."""
    from rankwise.models import tiny_llama

    tiny_llama(0).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    argv = ["finetune", "--model", str(tmp_path / "tiny"), "--task", "wiki-lm", "--method", "full", "--optimizer",
            "lora-pre", "--optimizer-rank", "33", "--out", str(tmp_path / "o")]
    assert "at most 32" in _error(capsys, argv)
    with pytest.raises(Worked):
        main([*argv[:-3], "32", "--out", str(tmp_path / "o")])


@pytest.mark.method("care-mla")
@pytest.mark.parametrize("extra, says", [
    (["--kv-rank", "100000"], "exceeds smollm2-135m's K/V width of 192"),
    (["--kv-rank", "193", "--deploy"], "exceeds smollm2-135m's K/V width of 192"),
    (["--kv-rank", "48", "--deploy", "--rope-dims", "66"], "--rope-dims 66 must be an even number in [2, 64]"),
])
def test_convert_mla_ranks_beyond_the_models_sizes_are_refused_before_loading(extra, says, capsys, no_work):
    """The K/V width (3 KV heads x 64) comes from the embedded model's record: no load, no calibration."""
    assert says in _error(capsys, ["convert", "mla", "--model", "smollm2-135m", *extra])


@pytest.mark.method("care-mla")
def test_a_too_short_calibration_text_is_refused_before_loading(tmp_path, capsys, no_work):
    short = tmp_path / "short.txt"
    short.write_text("a few words", encoding="utf-8")
    err = _error(capsys, ["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "48", "--calibration-text", str(short)])
    assert "fewer than one window of 32 tokens" in err and "--calib-seq-len" in err
    unreadable = tmp_path / "folder.txt"
    unreadable.mkdir()  # not a file
    assert "no such file" in _error(capsys, ["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "48",
                                              "--calibration-text", str(unreadable)])
    with pytest.raises(Worked):  # enough bytes for a window: counted exactly, once the tokenizer is loaded
        short.write_text("word " * 40, encoding="utf-8")
        main(["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "48", "--calibration-text", str(short)])


@pytest.mark.method("care-mla")
def test_a_heal_dir_holding_a_users_files_is_refused_up_front_with_advice_that_applies(tmp_path, capsys, no_work):
    """It failed after 49 s of work, advising --overwrite, which is about --out."""
    base = ["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "48", "--deploy", "--heal", "2"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    err = _error(capsys, [*base, "--heal-dir", str(mine)])
    assert "notes.txt" in err and "--overwrite" not in err and "name a new or empty folder" in err
    theirs = tmp_path / "theirs"
    (theirs / "checkpoint").mkdir(parents=True)
    (theirs / "checkpoint" / "state.txt").write_text("not rankwise's")
    err = _error(capsys, [*base, "--heal-dir", str(theirs)])
    assert "checkpoint/ is not a rankwise training checkpoint" in err and "--overwrite" not in err
    assert "overlap" in _error(capsys, [*base, "--heal-dir", str(tmp_path / "o" / "heal"), "--out", str(tmp_path / "o")])
    assert (mine / "notes.txt").read_text() == "mine"
    with pytest.raises(Worked):  # a new folder passes
        main([*base, "--heal-dir", str(tmp_path / "new")])


def test_an_out_name_whose_temporary_exceeds_the_name_limit_is_refused_before_any_work(tmp_path, capsys, no_work):
    """A 240-character `quantize --out` name fits NAME_MAX (255), but the atomic writer's temporary beside it
    (`.NAME.rwPID@HOST.XXXXXXXX.tmp`) does not: that failed after the whole quantization."""
    name = "q" * 240
    err = _error(capsys, ["quantize", "--model", "minilm-l6", "--out", str(tmp_path / name)])
    assert "temporary beside it" in err and "choose a name of at most" in err
    assert "more than the 255" in _error(capsys, ["quantize", "--model", "minilm-l6", "--out", str(tmp_path / ("q" * 300))])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(Worked):  # a finetune run folder is made with mkdir, no temporary: the same name is fine
        main([*FINETUNE, "--out", str(tmp_path / name)])


# -- issue 32, item 14: what the file system refuses is one line, not a traceback -----------------------------------
def test_an_unreadable_calibration_text_is_refused_in_words(tmp_path, capsys, monkeypatch, no_work):
    from unreadable import make_unreadable

    text = tmp_path / "mine.txt"
    text.write_text("word " * 100, encoding="utf-8")
    make_unreadable(text, monkeypatch)
    err = _error(capsys, ["convert", "mla", "--model", "smollm2-135m", "--kv-rank", "48", "--calibration-text", str(text)])
    assert "cannot be read (Permission denied)" in err


def test_a_path_the_system_refuses_anywhere_is_one_line_naming_it(capsys, monkeypatch):
    """The last line of defence in the CLI: an OSError about a path (permissions, a name too long) that no check
    caught first is said in words; an OSError that names no path is a bug and still raises."""
    import errno

    import rankwise.commands.info as info

    def refused(args):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/model/tokenizer.json")

    monkeypatch.setattr(info, "run", refused)
    assert "/data/model/tokenizer.json: Permission denied; check its permissions" in _error(capsys, ["info", "x"])

    def too_long(args):
        raise OSError(errno.ENAMETOOLONG, "File name too long", "/tmp/" + "x" * 300)

    monkeypatch.setattr(info, "run", too_long)
    assert "(305 characters): File name too long; a name or the whole path" in _error(capsys, ["info", "x"])

    def bug(args):
        raise OSError("no path")

    monkeypatch.setattr(info, "run", bug)
    with pytest.raises(OSError, match="no path"):
        main(["info", "x"])
