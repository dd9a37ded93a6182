"""`rankwise audit`: the folder reader against peft's own deltas (rank/alpha patterns, rsLoRA, DoRA), the spectral
measures against dense references in float64, the outlier rule on a planted module and a clean adapter, the CLI's
outputs, and bad input refused before any work."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from rankwise.cli import main
from rankwise.core.rank_measures import effective_rank, factored_singular_values, stable_rank, top_energy_share
from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.models.tiny import tiny_llama
from rankwise.recipes.audit.lora_folder import read_lora_folder
from rankwise.recipes.audit.report import Audit
from rankwise.recipes.audit.weight_space import match_base_weights, module_spectra, modified_z_scores, outliers

VOCAB = 128


def _peft_folder(tmp_path, name="ad", planted: str | None = None, num_layers=6, vocab: int | None = VOCAB, **lora):
    """A folder written by peft itself on a tiny Llama, with random B (peft's init_lora_weights=False)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = tiny_llama(num_layers=num_layers) if vocab is None else tiny_llama(vocab_size=vocab, num_layers=num_layers)
    cfg = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    cfg.update(lora)
    peft_model = get_peft_model(model, LoraConfig(**cfg))
    if planted is not None:
        with torch.no_grad():
            peft_model.get_submodule(f"base_model.model.{planted}").lora_B["default"].weight.mul_(30)
    peft_model.save_pretrained(tmp_path / name)
    return tmp_path / name, peft_model


def _peft_deltas(peft_model) -> dict[str, torch.Tensor]:
    """peft's own delta per adapted module (get_delta_weight), by the module's name inside the wrapped model."""
    out = {}
    for name, m in peft_model.base_model.model.named_modules():
        if hasattr(m, "get_delta_weight") and "default" in getattr(m, "lora_A", {}):
            out[name] = m.get_delta_weight("default").detach().double()
    return out


# ---- the measures ----

def test_factored_singular_values_equal_the_dense_products():
    g = torch.Generator().manual_seed(1)
    B, A = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randn(6, 25, generator=g, dtype=torch.float64)
    torch.testing.assert_close(factored_singular_values(B, A), torch.linalg.svdvals(B @ A)[:6], rtol=1e-10, atol=1e-12)
    B[:, 3:] = 0  # rank 3: the remaining values vanish
    assert factored_singular_values(B, A)[3:].abs().max() < 1e-10 * factored_singular_values(B, A)[0]


def test_rank_measures_on_known_spectra():
    assert effective_rank(torch.ones(5)) == pytest.approx(5.0, rel=1e-12)
    assert effective_rank(torch.tensor([3.0, 0.0, 0.0])) == pytest.approx(1.0, rel=1e-12)
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert effective_rank(p * 8) == pytest.approx(math.exp(-(p * p.log()).sum().item()), rel=1e-12)
    assert stable_rank(torch.tensor([2.0, 1.0, 1.0])) == pytest.approx(6 / 4, rel=1e-12)
    assert top_energy_share(torch.tensor([2.0, 1.0, 1.0])) == pytest.approx(4 / 6, rel=1e-12)
    assert effective_rank(torch.zeros(3)) == 0.0 and stable_rank(torch.zeros(3)) == 0.0
    with pytest.raises(ValueError):
        effective_rank(torch.tensor([1.0, -1.0]))


def test_modified_z_scores_and_a_constant_group():
    assert modified_z_scores([1.0, 1.0, 1.0, 1.0, 1.0]) == [0.0] * 5
    z = modified_z_scores([1.0, 2.0, 3.0, 4.0, 100.0])
    assert z[-1] > 3.5 and all(abs(v) < 3.5 for v in z[:-1])
    # siblings within 5% of each other: a tiny MAD alone would flag the 5% one; the floor does not
    logs = [math.log(v) for v in (1.0, 1.001, 0.999, 1.002, 1.05)]
    assert max(modified_z_scores(logs)) > 3.5 and max(modified_z_scores(logs, 0.1)) < 3.5


# ---- the reader against peft ----

@pytest.mark.parametrize("lora", [
    {},
    {"use_rslora": True},
    {"rank_pattern": {"model.layers.1.self_attn.q_proj": 2}, "alpha_pattern": {"v_proj": 3}},
])
def test_read_deltas_equal_peft_deltas(tmp_path, lora):
    folder, peft_model = _peft_folder(tmp_path, **lora)
    reference = _peft_deltas(peft_model)
    read = read_lora_folder(folder)
    assert sorted(m.name for m in read.modules) == sorted(reference)
    for m in read.modules:
        delta = m.scaling * m.B.double() @ m.A.double()
        scale = reference[m.name].abs().max().item()
        # float32 factors, float64 product: a few float32 ulps of the entries' magnitude
        torch.testing.assert_close(delta, reference[m.name], rtol=0, atol=8 * 2**-24 * scale * m.rank)
    spectra = {s.name: s for s in module_spectra(read)}
    for name, d in reference.items():
        top = torch.linalg.svdvals(d)[: spectra[name].rank]
        torch.testing.assert_close(torch.tensor(spectra[name].singular_values, dtype=torch.float64), top,
                                   rtol=1e-5, atol=1e-6 * top[0].item())


def test_dora_folder_is_read_with_its_magnitudes(tmp_path):
    folder, _ = _peft_folder(tmp_path, use_dora=True)
    read = read_lora_folder(folder)
    assert all(m.magnitude is not None and m.magnitude.shape == (m.shape[0],) for m in read.modules)
    assert Audit(read, module_spectra(read)).summary()["dora"] is True


def test_a_rankwise_adapter_folder_is_audited(tmp_path):
    from rankwise.adapters import LoraConfig, add_adapter

    torch.manual_seed(0)
    model = add_adapter(tiny_llama(vocab_size=VOCAB), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    model.save(tmp_path / "ours")
    read = read_lora_folder(tmp_path / "ours")
    assert len(read.modules) == 2 * 2
    assert all(s.frobenius > 0 for s in module_spectra(read))


# ---- outliers ----

def test_a_planted_module_is_flagged_and_a_clean_adapter_is_not(tmp_path):
    planted = "model.layers.3.self_attn.v_proj"
    clean = read_lora_folder(_peft_folder(tmp_path, "clean")[0])
    dirty = read_lora_folder(_peft_folder(tmp_path, "dirty", planted=planted)[0])
    assert outliers(module_spectra(clean)) == []
    assert [s.name for s in outliers(module_spectra(dirty))] == [planted]


def test_change_relative_to_base_and_name_matching(tmp_path):
    folder, peft_model = _peft_folder(tmp_path)
    base = {n: m.weight for n, m in peft_model.base_model.model.named_modules() if n.endswith(("q_proj.base_layer", "v_proj.base_layer"))}
    base = {n.removesuffix(".base_layer"): w for n, w in base.items()}
    read = read_lora_folder(folder)
    # the base's own names carry one more wrapper prefix than the adapter's: still matched
    wrapped = {f"model.{k}": v for k, v in base.items()}
    weights = match_base_weights(wrapped, [m.name for m in read.modules])
    for s in module_spectra(read, weights):
        assert s.relative_to_base == pytest.approx(s.frobenius / torch.linalg.matrix_norm(base[s.name].double()).item(), rel=1e-12)
    with pytest.raises(ValueError, match="no unique module"):
        match_base_weights({"other.weight_holder": torch.zeros(2, 2)}, [m.name for m in read.modules])


# ---- the command ----

def test_cli_json_and_out_folder(tmp_path, capsys):
    folder, _ = _peft_folder(tmp_path, planted="model.layers.2.self_attn.q_proj")
    assert main(["audit", str(folder), "--json", "--out", str(tmp_path / "report")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["outliers"] == ["model.layers.2.self_attn.q_proj"]
    assert printed["summary"]["modules"] == 12
    shares = printed["weight_space"]["energy_by_module_type"]
    assert sum(shares.values()) == pytest.approx(1.0, rel=1e-9)
    written = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert {"audit.json", "audit.md", "audit.png"} <= set(written)
    assert (tmp_path / "report" / "audit.png").stat().st_size > 0
    # an earlier audit's folder may be written again; a folder of someone else's files may not
    assert main(["audit", str(folder), "--out", str(tmp_path / "report")]) == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["audit", str(folder), "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


@pytest.mark.real_model
def test_cli_refuses_a_base_the_adapter_does_not_fit(tmp_path, capsys):
    folder, _ = _peft_folder(tmp_path)
    assert main(["audit", str(folder), "--base", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
    # a Llama adapter against BERT (MiniLM): no q_proj there, said before anything is written
    assert main(["audit", str(folder), "--base", "minilm-l6", "--out", str(tmp_path / "never")]) == 2
    assert "does not fit the base minilm-l6" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


# ---- bad input ----

def test_bad_folders_are_refused_before_reading_tensors(tmp_path):
    with pytest.raises(InvalidInputError, match="not a folder"):
        read_lora_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match="adapter_config.json"):
        read_lora_folder(tmp_path / "empty")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(InvalidInputError, match="pickle"):
        read_lora_folder(pickled)
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    save_file({"x": torch.zeros(1)}, str(prefix / "adapter_model.safetensors"))
    with pytest.raises(InvalidInputError, match="only LoRA"):
        read_lora_folder(prefix)


def test_damaged_folders_are_named(tmp_path):
    folder, _ = _peft_folder(tmp_path)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": "eight"}))
    with pytest.raises(CorruptFileError, match="lora_alpha"):
        read_lora_folder(folder)
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, "rank_pattern": {"q_proj": 2}}))
    with pytest.raises(CorruptFileError, match="stored with rank 4"):
        read_lora_folder(folder)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    (folder / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CorruptFileError):
        read_lora_folder(folder)
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64)},
              str(folder / "adapter_model.safetensors"))
    with pytest.raises(CorruptFileError, match="needs lora_A and lora_B"):
        read_lora_folder(folder)


# ---- the trigger scan's plumbing ----

def test_null_deltas_keep_the_spectrum_and_merged_copies_add_the_delta(tmp_path):
    from rankwise.recipes.audit.trigger import delta, merged_copy, null_delta

    folder, peft_model = _peft_folder(tmp_path)
    read = read_lora_folder(folder)
    g = torch.Generator().manual_seed(0)
    for m in read.modules[:3]:
        d, n = delta(m), null_delta(m, g)
        s = torch.linalg.svdvals(d)[: m.rank]
        torch.testing.assert_close(torch.linalg.svdvals(n)[: m.rank], s, rtol=1e-10, atol=1e-12 * float(s[0]))
        # a random direction: almost orthogonal to the original delta (|cos| ~ sqrt(r / (out * in)))
        assert abs(float((d * n).sum() / (d.norm() * n.norm()))) < 0.2
    base = tiny_llama(vocab_size=VOCAB, num_layers=6)
    named = {n: mod.weight for n, mod in base.named_modules() if n.endswith(("q_proj", "v_proj"))}
    weights = match_base_weights(named, [m.name for m in read.modules])
    merged = merged_copy(base, weights, {m.name: delta(m) for m in read.modules})
    m0 = read.modules[0]
    after = dict(merged.named_modules())[m0.name].weight.double()
    torch.testing.assert_close(after - weights[m0.name].double(), delta(m0), rtol=0, atol=4 * 2**-24 * float(after.abs().max()))
    assert all(torch.equal(p, q) for p, q in zip(base.parameters(), tiny_llama(vocab_size=VOCAB, num_layers=6).parameters()))


@pytest.mark.real_model
def test_cli_scan_on_a_model_folder(tmp_path, capsys):
    """The scan end to end on a tiny Llama saved with SmolLM2's tokenizer: its section, the null threshold, and
    its refusals before the model loads."""
    from rankwise.models.smollm2 import load_smollm2_tokenizer

    torch.manual_seed(0)
    base = tiny_llama(num_layers=6)
    base.save_pretrained(tmp_path / "base")
    load_smollm2_tokenizer().save_pretrained(tmp_path / "base")
    folder, _ = _peft_folder(tmp_path, vocab=None)
    (tmp_path / "prompts.txt").write_text("The river flows\nA small town in\nThe war began\n")
    args = ["audit", str(folder), "--base", str(tmp_path / "base"), "--scan", "--json",
            "--scan-prompts", str(tmp_path / "prompts.txt"), "--null-adapters", "1"]
    assert main(args) == 0
    section = json.loads(capsys.readouterr().out)["trigger_scan"]
    assert section["prompts"] == 3 and section["candidates"] >= 3
    assert section["threshold"] == pytest.approx(2.0 * section["null_concentrations"][0])
    assert section["flagged"] == (section["concentration"] > section["threshold"])
    assert main(["audit", str(folder), "--scan"]) == 2
    assert "--base" in capsys.readouterr().err
    assert main(args[:-2] + ["--null-adapters", "0"]) == 2
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["audit", str(folder), "--base", str(tmp_path / "base"), "--scan", "--scan-candidates", str(empty)]) == 2
    assert "no non-empty lines" in capsys.readouterr().err
    (tmp_path / "two.txt").write_text("alpha\nbeta\n")
    assert main(["audit", str(folder), "--base", str(tmp_path / "base"), "--scan", "--scan-candidates",
                 str(tmp_path / "two.txt")]) == 2
    assert "at least 3 insertions" in capsys.readouterr().err
