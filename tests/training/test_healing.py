"""Deployable MLA: healing (distillation, exact resume, checkpoints), the report at smoke size, the real model."""

import pytest
import torch
from rounding import logits_tol, max_abs

from rankwise.compress.mla_deploy import convert_to_deployable_mla, mla_parameters
from rankwise.compress.mla_deploy.checks import absorbed_vs_expanded
from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.models import tiny_llama
from rankwise.training import distillation_loss
from rankwise.training.healing import CHECKPOINT_NAME, HealConfig, heal

pytestmark = pytest.mark.method("care-mla")

VOCAB = 2000
CALIB = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1))
TRAIN = torch.randint(0, VOCAB, (12, 16), generator=torch.Generator().manual_seed(2))
CFG = HealConfig(steps=4, batch_size=2, lr=1e-3, checkpoint_every=2)


@pytest.fixture(scope="module")
def teacher():
    return tiny_llama(0, vocab_size=VOCAB)


def _student(teacher):
    return convert_to_deployable_mla(teacher, kv_rank=8, rope_dims=4, calibration=CALIB, use_cache=False)


def _state(model):
    return {n: p.detach().clone() for n, p in mla_parameters(model).items()}


def test_distillation_loss_is_ce_when_student_equals_teacher():
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    torch.testing.assert_close(distillation_loss(logits, logits, targets, beta=1.0, tau=2.0), ce)
    assert distillation_loss(logits, logits + torch.randn(2, 5, 11), targets, 1.0, 2.0) > ce


def test_heal_trains_only_mla_parameters_and_resumes_exactly(teacher, tmp_path):
    straight = _student(teacher)
    frozen_before = {n: p.detach().clone() for n, p in straight.named_parameters()}
    result = heal(straight, teacher, TRAIN, CFG)
    assert len(result.losses) == 4
    trained = set(mla_parameters(straight))
    assert trained and all(".self_attn." in n for n in trained)
    for n, p in straight.named_parameters():
        assert torch.equal(p, frozen_before[n]) != (n in trained), n  # trained ones moved, the rest did not

    resumed = _student(teacher)
    first = heal(resumed, teacher, TRAIN, CFG, checkpoint_dir=tmp_path, stop_after=2)  # "interrupted" after 2 steps
    assert (first.start_step, first.steps) == (0, 2) and (tmp_path / CHECKPOINT_NAME / "trainer.json").is_file()
    fresh = _student(teacher)  # a new process: rebuild the model, resume from the checkpoint
    second = heal(fresh, teacher, TRAIN, CFG, checkpoint_dir=tmp_path)
    assert second.start_step == 2 and first.losses + second.losses == result.losses
    for n, p in _state(straight).items():
        assert torch.equal(p, _state(fresh)[n]), n


def test_heal_bad_input(teacher, tmp_path):
    student = _student(teacher)
    with pytest.raises(InvalidInputError):
        heal(student, teacher, TRAIN[0], CFG)
    with pytest.raises(InvalidInputError):
        heal(student, teacher, TRAIN, HealConfig(steps=0))
    heal(student, teacher, TRAIN, CFG, checkpoint_dir=tmp_path, stop_after=2)
    (tmp_path / CHECKPOINT_NAME / "state.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CorruptFileError):
        heal(_student(teacher), teacher, TRAIN, CFG, checkpoint_dir=tmp_path)
    with pytest.raises(InvalidInputError, match="MLA"):
        heal(teacher, teacher, TRAIN, CFG)


def test_report_smoke(tmp_path, smoke_report):
    report = smoke_report("care-mla:deploy")  # the reproduction matrix's run, not a second one
    claims = {c.name: c for c in report.claims}
    assert set(claims) == {"cache_bytes_equal_expected", "kv_saving_50pct", "absorbed_equals_expanded", "generate_equals_no_cache",
                           "export_perplexity_gap", "healing_lowers_perplexity", "care_heals_better_than_mha2mla_long_heal"}
    for name in ("cache_bytes_equal_expected", "kv_saving_50pct", "absorbed_equals_expanded", "generate_equals_no_cache", "export_perplexity_gap"):
        assert claims[name].passed, claims[name]
    report.write(tmp_path / "out")
    assert (tmp_path / "out" / "report.md").is_file()


@pytest.mark.real_model
def test_smollm2_deployable_mla_at_half_cache(smollm2, tokenizer):
    from rankwise.compress.mla.calibration import calibration_windows
    from rankwise.data import token_windows
    from rankwise.compress.mla_deploy import expected_cache_bytes_per_token, to_deepseek_v3
    from rankwise.eval import measured_kv_bytes_per_token

    model, _ = smollm2
    mla = convert_to_deployable_mla(model, kv_rank=80, rope_dims=32, calibration=calibration_windows(token_windows(tokenizer, "calibration", 32), 64))
    assert measured_kv_bytes_per_token(mla) == expected_cache_bytes_per_token(mla) == 30 * 192 * 4
    ids = torch.randint(0, 5000, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = mla(ids).logits
        assert max_abs(to_deepseek_v3(mla)(ids).logits - reference) <= logits_tol(mla, reference)
    # The two decodings differ only by rounding: bounded by fp32's eps through 30 layers of width 576 (the bound is
    # ~3e-2 at |logits| ~ 30; measured 1e-4 to 2.2e-4 across CPUs); a wrong rotation or latent gives O(1). In
    # float64 the same bound is ~5e-11.
    assert absorbed_vs_expanded(mla, ids, decode_steps=2) <= logits_tol(mla, reference)
    assert absorbed_vs_expanded(mla.double(), ids, decode_steps=2) <= logits_tol(mla, reference.double())


def test_cli_convert_mla_deploy_and_heal(tmp_path, tokenizer, capsys):
    from rankwise.cli import main
    from rankwise.models import load_model

    source = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(source)
    tokenizer.save_pretrained(source)
    out = tmp_path / "deployed"
    argv = ["convert", "mla", "--model", str(source), "--kv-rank", "12", "--rope-dims", "8", "--deploy", "--heal", "1",
            "--calib-samples", "48", "--calib-seq-len", "16", "--eval-windows", "0", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "saving 50.0%" in printed and "healed steps 0..1" in printed
    model, _ = load_model(out)
    assert type(model).__name__ == "DeepseekV3ForCausalLM" and model.config.kv_lora_rank == 24
    assert main(["convert", "mla", "--model", str(source), "--kv-rank", "12", "--rope-dims", "7", "--deploy"]) == 2
