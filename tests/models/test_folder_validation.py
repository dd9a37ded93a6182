"""What a folder is, and who takes it: every kind of folder rankwise writes, identified from its JSON, loaded by
`load_model` or refused with a clear error, and accepted or refused up front by every command taking `--model`.
Issue 17, items 4, 8 (broken folders) and 13 (`rankwise info`, `rankwise eval` on an adapter)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rankwise.cli import main
from rankwise.errors import CorruptFileError, InvalidInputError, UnknownNameError
from rankwise.models import folders, load_model, load_smollm2_tokenizer, tiny_llama

CALIB = torch.randint(0, 2000, (8, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """One folder of each kind rankwise writes, from a tiny Llama with SmolLM2's tokenizer (seconds, no real model)."""
    from rankwise.adapters import LoraConfig, add_adapter
    from rankwise.compress.mla import convert_to_mla, save_mla
    from rankwise.compress.mla_deploy import convert_to_deployable_mla, export_deepseek_v3
    from rankwise.quant import make_recipe, save_quantized

    root = tmp_path_factory.mktemp("kinds")
    tokenizer = load_smollm2_tokenizer()
    out = {}
    out["model"] = root / "model"
    tiny_llama(0).save_pretrained(out["model"])
    tokenizer.save_pretrained(out["model"])
    out["mla-oneshot"] = save_mla(convert_to_mla(tiny_llama(0), 8, "svd"), root / "mla", tokenizer)
    deploy = convert_to_deployable_mla(tiny_llama(0), kv_rank=12, rope_dims=8, calibration=CALIB, use_cache=False)
    out["mla-deploy"] = export_deepseek_v3(deploy, root / "deploy", tokenizer)
    save_quantized(tiny_llama(0), tokenizer, make_recipe("fp4", "ue5m3", 16), root / "quantized")
    out["quantized"] = root / "quantized"
    adapted = add_adapter(tiny_llama(0), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    torch.nn.init.normal_(next(p for n, p in adapted.named_parameters() if "lora_B" in n or n.endswith(".B")), std=0.5)
    out["adapter"] = adapted.save(root / "run" / "adapter", base_model_name_or_path=str(out["model"]))
    (root / "run" / "metrics.json").write_text(json.dumps({"model": str(out["model"]), "method": "lora", "rank": 2}))
    out["finetune-run"] = root / "run"
    (root / "run" / "checkpoint").mkdir()
    (root / "run" / "checkpoint" / "trainer.json").write_text(json.dumps({"kind": "rankwise-train-checkpoint", "version": 1, "step": 7}))
    out["checkpoint"] = root / "run" / "checkpoint"
    return out


def test_each_kind_is_identified_from_its_files(kinds):
    for kind, path in kinds.items():
        info = folders.identify(path)
        assert info.kind == kind, (kind, info)
        assert info.load, kind
    assert folders.identify("smollm2-135m").causal and not folders.identify("minilm-l6").causal
    assert folders.identify(kinds["adapter"]).base == str(kinds["model"])


def test_one_shot_mla_is_refused_by_stock_transformers_and_reloaded_exactly_by_rankwise(kinds):
    """Item 4: declared as a plain Llama it loaded with random K/V projections; now its own model_type is refused."""
    config = json.loads((kinds["mla-oneshot"] / "config.json").read_text())
    assert config["model_type"] == "rankwise-mla-oneshot" and config["rankwise_mla"]["base_model_type"] == "llama"
    with pytest.raises((ValueError, KeyError, OSError)):
        AutoModelForCausalLM.from_pretrained(kinds["mla-oneshot"])
    from rankwise.compress.mla import convert_to_mla

    expected = convert_to_mla(tiny_llama(0), 8, "svd")
    model, tokenizer = load_model(kinds["mla-oneshot"])
    ids = torch.randint(0, 2000, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected(ids).logits)  # same modules, same fp32 weights: bit for bit
    assert tokenizer is not None


def test_deployable_mla_loads_in_stock_transformers(kinds):
    model = AutoModelForCausalLM.from_pretrained(kinds["mla-deploy"])
    assert model.config.model_type == "deepseek_v3"
    assert json.loads((kinds["mla-deploy"] / "rankwise-manifest.json").read_text())["mla_deploy"]["kv_rank"] == 12


# Which kinds each command takes; the rest must be refused before the model is loaded.
COMMANDS = {
    "eval": (["eval", "ppl", "--max-windows", "1", "--seq-len", "16"], {"model", "mla-oneshot", "mla-deploy", "quantized", "adapter"}),
    "quantize": (["quantize", "--out", "{out}"], {"model", "mla-deploy"}),
    "convert": (["convert", "mla", "--kv-rank", "4", "--eval-windows", "0"], {"model"}),
    "finetune": (["finetune", "--task", "wiki-lm", "--method", "lora", "--rank", "2", "--out", "{out}"], {"model", "quantized", "mla-deploy"}),
    "place": (["place", "--task", "wiki-lm"], {"model", "quantized", "mla-deploy"}),
}


class Loaded(Exception):
    """Raised by the patched load_model: the command got past its up-front checks."""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_accepts_or_refuses_each_kind_up_front(command, kinds, tmp_path, monkeypatch, capsys):
    import rankwise.models

    def loaded(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(rankwise.models, "load_model", loaded)
    argv, accepted = COMMANDS[command]
    for kind, path in kinds.items():
        out = tmp_path / f"{command}-{kind}"
        args = [a.replace("{out}", str(out)) for a in argv] + ["--model", str(path)]
        if kind in accepted:
            with pytest.raises(Loaded):
                main(args)
        else:
            assert main(args) == 2, (command, kind)
            err = capsys.readouterr().err
            assert "rankwise: error: --model" in err and "Traceback" not in err, (command, kind, err)
            assert not out.exists()  # refused before anything was written


def test_quantize_of_a_one_shot_mla_writes_nothing(kinds, tmp_path, capsys):
    """Item 4: it used to crash after writing an unloadable folder."""
    assert main(["quantize", "--model", str(kinds["mla-oneshot"]), "--out", str(tmp_path / "q")]) == 2
    assert "one-shot MLA" in capsys.readouterr().err and not (tmp_path / "q").exists()


def test_load_model_refuses_folders_that_are_not_models(kinds):
    for kind in ("adapter", "finetune-run", "checkpoint"):
        with pytest.raises(InvalidInputError, match="not a model"):
            load_model(kinds[kind])


def _copy(src, dst, skip=()):
    dst.mkdir()
    for p in src.iterdir():
        if p.name not in skip:
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_broken_plain_folders_get_a_clear_error(kinds, tmp_path):
    """Item 8: `{}` as config, a config without weights, weights without a tokenizer (it blamed sentencepiece)."""
    empty = tmp_path / "empty-config"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(CorruptFileError, match="no model_type"):
        load_model(empty)
    no_weights = _copy(kinds["model"], tmp_path / "no-weights", skip={"model.safetensors"})
    with pytest.raises(CorruptFileError, match="no weights"):
        load_model(no_weights)
    no_tokenizer = _copy(kinds["model"], tmp_path / "no-tokenizer", skip={"tokenizer.json", "tokenizer_config.json"})
    with pytest.raises(CorruptFileError, match="no tokenizer files") as e:
        load_model(no_tokenizer)
    assert "sentencepiece" not in str(e.value)
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(UnknownNameError):
        load_model(tmp_path / "nowhere")
    for bad in (empty, no_weights, no_tokenizer):  # the same refusal up front, through the CLI
        assert main(["eval", "ppl", "--model", str(bad)]) == 2


def test_info_says_what_each_folder_is(kinds, capsys):
    """Item 13."""
    expect = {"model": "transformers causal language model", "mla-oneshot": "one-shot MLA conversion",
              "mla-deploy": "DeepSeek-V3", "quantized": "block-quantized", "adapter": "lora adapter",
              "finetune-run": "finetune run", "checkpoint": "step 7"}
    for kind, path in kinds.items():
        assert main(["info", str(path)]) == 0
        out = capsys.readouterr().out
        assert expect[kind] in out and f"kind: {kind}" in out and "load with:" in out, (kind, out)
    assert main(["info", str(kinds["quantized"]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "quantized" and data["made"]["recipe"]["block_size"] == 16
    assert main(["info", "/no/such/folder"]) == 2


def test_eval_ppl_of_an_adapter_runs_on_its_base(kinds, capsys):
    """Item 13: `rankwise eval` on an adapter folder loads its recorded base, applies the adapter, and scores it."""
    args = ["eval", "ppl", "--split", "eval", "--max-windows", "2", "--seq-len", "16"]
    assert main([*args, "--model", str(kinds["adapter"])]) == 0
    adapted = capsys.readouterr().out
    assert main([*args, "--model", str(kinds["model"])]) == 0
    base = capsys.readouterr().out
    assert "adapter on" in adapted and "perplexity" in adapted
    assert adapted.split("perplexity")[1] != base.split("perplexity")[1]  # the adapter (B != 0) changes the model


# -- issue 32, item 14: damaged and hand-edited folders are named in words, never a traceback -----------------------
def _info_error(capsys, path) -> str:
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankwise: error:") and "Traceback" not in err
    return err


def test_a_truncated_safetensors_in_a_plain_folder_is_damaged_not_loadable(kinds, tmp_path, capsys):
    """`info` called it loadable and `load_model` raised a raw SafetensorError: the header says how long it must be."""
    import shutil

    for name, cut in (("truncated", lambda b: b[: len(b) // 2]), ("padded", lambda b: b + b"\0" * 16),
                      ("garbled", lambda b: b"\xff" * 64)):
        folder = tmp_path / name
        shutil.copytree(kinds["model"], folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(cut(weights.read_bytes()))
        err = _info_error(capsys, folder)
        assert f"{weights} is damaged" in err, err
        with pytest.raises(CorruptFileError, match="is damaged"):
            load_model(folder)
    assert "truncated" in _info_error(capsys, tmp_path / "truncated")
    assert main(["info", str(kinds["model"])]) == 0  # an intact one still passes


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    path.write_text(json.dumps(edit(data)))


@pytest.mark.parametrize("kind, file, edit, says", [
    ("model", "config.json", lambda d: {**d, "architectures": 5}, "field 'architectures' must be a list"),
    ("quantized", "quantization.json", lambda d: {**d, "recipe": "fp4"}, "field 'recipe' must be a JSON object"),
    ("quantized", "quantization.json", lambda d: {**d, "layers": 5}, "field 'layers' must be a JSON object"),
    ("quantized", "quantization.json", lambda d: [d], "holds a list, not a JSON object"),
    ("adapter", "rankwise_adapter.json", lambda d: {**d, "config": "lora"}, "field 'config' must be a JSON object"),
    ("adapter", "rankwise_adapter.json", lambda d: {**d, "modules": 5}, "field 'modules' must be a list"),
    ("adapter", "adapter_config.json", lambda d: {**d, "r": "two"}, "field 'r' must be an integer"),
    ("checkpoint", "trainer.json", lambda d: [d], "holds a list, not a JSON object"),
    ("checkpoint", "trainer.json", lambda d: {**d, "step": "seven"}, "field 'step' must be an integer"),
])
def test_info_names_a_wrong_typed_field_of_a_hand_edited_file(kinds, tmp_path, capsys, kind, file, edit, says):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(kinds[kind], folder)
    _edit_json(folder / file, edit)
    err = _info_error(capsys, folder)
    assert says in err and file in err, err


def test_a_crafted_quantization_json_is_refused_by_the_loader_naming_the_file(kinds, tmp_path):
    """With the manifest rewritten to match (a crafted folder, not a damaged one): a layer the model lacks, a shape
    that is not [out, in], a block size that is not an integer."""
    import shutil

    from rankwise.core.io import read_json, write_manifest

    for edit, says in ((lambda d: {**d, "layers": {"nope.layer": [4, 4]}}, "lists a layer 'nope.layer'"),
                       (lambda d: {**d, "layers": {k: "x" for k in d["layers"]}}, r"not \[out, in\]"),
                       (lambda d: {**d, "recipe": {**d["recipe"], "block_size": "big"}}, "block_size must be an integer")):
        folder = tmp_path / "q"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(kinds["quantized"], folder)
        _edit_json(folder / "quantization.json", edit)
        manifest = read_json(folder / "rankwise-manifest.json")
        write_manifest(folder, {k: v for k, v in manifest.items() if k != "files"})
        with pytest.raises(CorruptFileError, match=says):
            load_model(folder)


def test_names_beyond_the_systems_limits_are_refused_in_words(tmp_path, capsys):
    """`Path.exists()` itself raises OSError(ENAMETOOLONG) on such a name: it was a traceback."""
    assert "more than the 255" in _info_error(capsys, tmp_path / ("x" * 300))
    assert "for a path" in _info_error(capsys, tmp_path / "/".join(["d" * 200] * 25))
    assert main(["eval", "ppl", "--model", str(tmp_path / ("x" * 300))]) == 2
    assert "nothing of that name can exist" in capsys.readouterr().err
