"""The care-mla experiments' set-up: baseline initialisations for healing, and no tuning on the evaluation split."""

from __future__ import annotations

import pytest
import torch

from rankwise.compress.mla_deploy import convert_to_deployable_mla, deploy_info, mla_layers
from rankwise.models import tiny_llama

pytestmark = pytest.mark.method("care-mla")

VOCAB = 2000
CALIB = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def model():
    return tiny_llama(0, vocab_size=VOCAB)


def test_plain_svd_init_is_the_unwhitened_best_rank_r_value_factor(model):
    """Palu's init: V's latent factors are the Frobenius-best rank-r approximation of W_V (Eckart-Young)."""
    rank = 6
    mla = convert_to_deployable_mla(model, rank, 8, "high", CALIB, method="svd", use_cache=False)
    care = convert_to_deployable_mla(model, rank, 8, "high", CALIB, use_cache=False)
    assert deploy_info(mla)["method"] == "svd" and deploy_info(care)["method"] == "care"
    for layer, attn, care_attn in zip(model.model.layers, mla_layers(mla), mla_layers(care)):
        w_v = layer.self_attn.v_proj.weight.detach().double()
        down = attn.kv_a_proj.weight.detach().double()[attn.k_rank : attn.k_rank + attn.v_rank]
        approx = attn.v_up.weight.detach().double() @ down
        sigma = torch.linalg.svdvals(w_v)
        best = float(sigma[rank:].square().sum())
        err = float((w_v - approx).square().sum())
        assert err == pytest.approx(best, rel=1e-4)  # fp32 storage of the factors: relative rounding ~1e-7 per entry
        care_down = care_attn.kv_a_proj.weight.detach().double()[care_attn.k_rank : care_attn.k_rank + care_attn.v_rank]
        care_err = float((w_v - care_attn.v_up.weight.detach().double() @ care_down).square().sum())
        assert care_err > best * (1 + 1e-3)  # CARE minimises activation error, not weight error: a different init


def test_main_tests_adjusted_ranks_where_the_paper_claims_the_gain():
    from rankwise.repro.care_mla.main import SIZES

    full = SIZES["full"]
    assert full.seeds >= 3 and full.high_saving_ranks and all(1 - r / 192 >= 0.875 for r in full.high_saving_ranks)
    assert set(full.high_saving_ranks) <= set(full.ranks) and full.mc_rank in full.ranks


def test_deploy_tunes_rope_pairs_and_lr_on_calibration_text_only(monkeypatch):
    """Every perplexity the healing experiments' validation selections (RoPE pairs, learning rate) read comes from
    the calibration split."""
    import rankwise.repro.care_mla.deploy_palu as deploy_palu
    import rankwise.repro.care_mla.heal_compare as shared

    split_of: dict[int, str] = {}
    seen: list[str] = []
    selecting = [False]
    real_windows, real_ppl = shared.token_windows, shared.perplexity

    def windows(tokenizer, split, *args):
        out = real_windows(tokenizer, split, *args)
        split_of[id(out)] = split
        return out

    def ppl(model, w, *args, **kw):
        if selecting[0]:
            seen.append(split_of.get(id(w), "unknown"))
        return real_ppl(model, w, *args, **kw)

    def selecting_while(real):
        def select(*args, **kw):
            selecting[0] = True
            try:
                return real(*args, **kw)
            finally:
                selecting[0] = False
        return select

    monkeypatch.setattr(shared, "token_windows", windows)
    monkeypatch.setattr(shared, "perplexity", ppl)
    monkeypatch.setattr(shared, "select_on_validation", selecting_while(shared.select_on_validation))
    monkeypatch.setattr(shared, "select_with_extension", selecting_while(shared.select_with_extension))
    report = deploy_palu.run("smoke")
    assert seen.count("calibration") >= 4 + 4 + 2 * 2  # both arms' four pair selections and two rates each
    assert set(seen) == {"calibration"}
    assert {c.name for c in report.claims} == {"care_heals_better_than_palu_long_heal", "healing_lowers_perplexity"}


def test_the_mha2mla_arm_has_a_joint_latent_and_its_own_pairs():
    from rankwise.repro.care_mla.deploy import ARMS
    from rankwise.repro.care_mla.heal_compare import MHA2MLA

    assert MHA2MLA in ARMS and MHA2MLA.method == "mha2mla" and MHA2MLA.selections == ("contribution",)
