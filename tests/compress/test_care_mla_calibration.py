"""Calibration from the user's own text: windows, the domain it fits, and `convert mla --calibration-text`."""

import pytest
import torch

from rankwise.compress.mla import activation_errors, decompose_kv, kv_input_moments, text_calibration_windows
from rankwise.data import token_windows
from rankwise.data.domains import domain_texts, domain_windows
from rankwise.errors import InvalidInputError
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("care-mla")


def test_text_windows_are_the_texts_tokens_joined_by_eos(tokenizer):
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    every = text_calibration_windows(tokenizer, text, seq_len=16, samples=None)
    assert every.shape == (len(ids) // 16, 16) and every.flatten().tolist() == ids[: every.numel()]
    few = text_calibration_windows(tokenizer, text, seq_len=16, samples=5, seed=3)
    rows = [tuple(r) for r in every.tolist()]
    assert few.shape == (5, 16) and all(tuple(r) in rows for r in few.tolist())
    assert torch.equal(few, text_calibration_windows(tokenizer, text, seq_len=16, samples=5, seed=3))
    # Fewer windows than samples: all of them, not an error (a user's file may be short).
    assert torch.equal(text_calibration_windows(tokenizer, text, seq_len=16, samples=10**6), every)
    two_docs = text_calibration_windows(tokenizer, ["a b c", "d e f"], seq_len=2, samples=None)
    assert (two_docs == tokenizer.eos_token_id).sum() >= 1


@pytest.mark.parametrize("bad", [dict(text=""), dict(text=["", " "]), dict(text="short", seq_len=64),
                                 dict(text="some text here", seq_len=1), dict(text="some text here", samples=0),
                                 dict(text=b"bytes")])
def test_bad_text_is_refused(tokenizer, bad):
    with pytest.raises(InvalidInputError):
        text_calibration_windows(tokenizer, **bad)


def test_calibration_fits_its_own_domain_both_ways(tokenizer):
    """CARE's held-out activation error is lower on the domain it was calibrated on, for each of two domains."""
    model = tiny_llama(seed=0)
    calib = {"wiki": text_calibration_windows(tokenizer, domain_texts("wiki", "calibration")[:200], 16, 64),
             "python-docs": text_calibration_windows(tokenizer, domain_texts("python-docs", "calibration"), 16, 64)}
    held = {"wiki": kv_input_moments(model, token_windows(tokenizer, "eval", 32, 16), use_cache=False),
            "python-docs": kv_input_moments(model, domain_windows(tokenizer, "python-docs", "eval", 32, 16), use_cache=False)}
    err = {}
    for c, windows in calib.items():
        plan = decompose_kv(model, "care", kv_input_moments(model, windows, use_cache=False)).plan(8)
        for d, moments in held.items():
            errs = activation_errors(model, plan, moments)
            err[c, d] = sum(e.k + e.v for e in errs)
    assert err["wiki", "wiki"] < err["python-docs", "wiki"]
    assert err["python-docs", "python-docs"] < err["wiki", "python-docs"]


def _tiny_folder(tmp_path, tokenizer):
    source = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(source)
    tokenizer.save_pretrained(source)
    return source


def test_cli_calibration_text_equals_the_python_path(tmp_path, tokenizer, capsys):
    from rankwise.cli import main
    from rankwise.compress.mla import convert_to_mla
    from rankwise.models import load_model

    source = _tiny_folder(tmp_path, tokenizer)
    text_file = tmp_path / "mine.txt"
    text = "\n\n".join(domain_texts("python-docs", "calibration")[:6])
    text_file.write_text(text, encoding="utf-8")
    eval_file = tmp_path / "held.txt"
    eval_file.write_text("\n\n".join(domain_texts("python-docs", "eval")[:3]), encoding="utf-8")
    out = tmp_path / "converted"
    argv = ["convert", "mla", "--model", str(source), "--kv-rank", "8", "--calibration-text", str(text_file),
            "--calib-samples", "40", "--calib-seq-len", "16", "--eval-windows", "2", "--seq-len", "32",
            "--eval-text", str(eval_file), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "40 x 16 tokens of" in printed and f"windows of {eval_file}" in printed
    cli_model, _ = load_model(out)
    windows = text_calibration_windows(tokenizer, text, 16, 40, seed=0)
    py_model = convert_to_mla(tiny_llama(0), 8, "care", calibration=windows)
    cli_sd, py_sd = cli_model.state_dict(), py_model.state_dict()
    assert cli_sd.keys() == py_sd.keys()
    for k in py_sd:
        assert torch.equal(cli_sd[k], py_sd[k]), k


def test_cli_default_calibration_is_the_mix_and_bad_files_are_refused(tmp_path, tokenizer, capsys):
    from rankwise.cli import main

    source = _tiny_folder(tmp_path, tokenizer)
    base = ["convert", "mla", "--model", str(source), "--kv-rank", "8", "--calib-samples", "8", "--calib-seq-len", "16", "--eval-windows", "0"]
    assert main(base) == 0
    assert "built-in set 'mix'" in capsys.readouterr().out
    assert main(base + ["--calibration-text", str(tmp_path / "missing.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not utf-8 \xff")
    assert main(base + ["--calibration-text", str(binary)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
