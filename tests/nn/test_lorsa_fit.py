"""Lorsa fitting, the SAE baseline, saving/loading and the interpretation tools."""

import json

import pytest
import torch

from rankwise.errors import CorruptFileError, InvalidInputError, NumericalError
from rankwise.nn.lorsa import (
    FitConfig, Lorsa, LorsaConfig, Rope, TopKSAE, fit, fvu, induction_score, load_lorsa, mechanism_fractions,
    previous_occurrence, purity, save_lorsa, top_activating_contexts,
)

pytestmark = pytest.mark.method("lorsa")
CFG = LorsaConfig(d_model=12, n_qk=2, n_ov=16, d_qk=4, k=4, rope=Rope(4, 1e4))


def _data(n=24, t=10, seed=0):
    """X and the output of a planted Lorsa (a sparse attention layer the student can represent exactly)."""
    torch.manual_seed(seed)
    teacher = Lorsa(CFG).eval()
    x = torch.randn(n, t, 12, generator=torch.Generator().manual_seed(seed)) * 3.0
    with torch.no_grad():
        y = teacher(x) * 0.01  # an arbitrary output scale: the fit normalises it away
    return x, y


def test_fit_learns_a_planted_sparse_attention_layer():
    x, y = _data()
    torch.manual_seed(1)
    student = Lorsa(CFG)
    before = fvu(student, x, y)
    result = fit(student, x, y, FitConfig(steps=150, lr=1e-2, batch_size=8, k_start=8))
    assert result.losses[-1] < result.losses[0]
    assert fvu(student, x, y) < 0.5 * min(before, 1.0)


def test_loss_ignores_the_first_position():
    x, y = _data()
    y2 = y.clone()
    y2[:, 0] = 1e3  # BOS / attention-sink position: excluded from the loss
    runs = []
    for target in (y, y2):
        torch.manual_seed(1)
        m = Lorsa(CFG)
        runs.append(fit(m, x, target, FitConfig(steps=5, lr=1e-3, batch_size=4)).losses)
    # the fit only ever reads y[:, 1:] (the scale too), so the two runs do the same arithmetic: identical losses
    assert runs[0] == runs[1]


def test_sae_keeps_k_latents_and_unit_decoder_rows():
    _, y = _data()
    sae = TopKSAE(12, 16, 3)
    fit(sae, y, y, FitConfig(steps=5, lr=1e-2, batch_size=4))
    # normalising a 12-wide row and measuring its norm again: two 12-term norms, (12 + 3) u worst case; 2x margin
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(16), rtol=0, atol=(12 + 3) * torch.finfo(torch.float32).eps)
    vals, idx = sae.encode(y)
    assert vals.shape == idx.shape == (24, 10, 3) and (vals >= 0).all()
    with pytest.raises(InvalidInputError, match=r"\[1, 16\]"):
        TopKSAE(12, 16, 17)


def test_schedules():
    c = FitConfig(steps=100, lr=1.0, warmup=0.1, decay=0.2, final_lr_ratio=0.0, k_start=40, k_warmup=0.1)
    assert c.lr_at(0) == pytest.approx(0.1) and c.lr_at(50) == 1.0 and c.lr_at(99) == pytest.approx(0.0)
    assert c.k_at(0, 8) == 40 and c.k_at(5, 8) == 24 and c.k_at(10, 8) == 8 and c.k_at(99, 8) == 8


def test_fit_bad_input():
    x, y = _data()
    m = Lorsa(CFG)
    with pytest.raises(InvalidInputError, match="share"):
        fit(m, x, y[:5], FitConfig(steps=1, lr=1e-3))
    with pytest.raises(InvalidInputError, match="nothing after"):
        fit(m, x[:, :1], y[:, :1], FitConfig(steps=1, lr=1e-3))
    with pytest.raises(NumericalError):
        fit(m, x, torch.zeros_like(y), FitConfig(steps=1, lr=1e-3))
    bad = x.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(NumericalError):
        fit(m, bad, y, FitConfig(steps=1, lr=1e-3))
    with pytest.raises(InvalidInputError):
        FitConfig(steps=0, lr=1e-3)


def test_save_load_round_trip(tmp_path):
    x, _ = _data()
    m = Lorsa(CFG)
    m.input_scale.fill_(2.5)
    save_lorsa(m, tmp_path / "l", source={"model": "m", "layer": 3})
    back, source = load_lorsa(tmp_path / "l")
    assert source == {"model": "m", "layer": 3} and back.config == CFG
    assert torch.equal(back(x), m(x))
    assert not list((tmp_path / "l").glob("*.pt")) and not list((tmp_path / "l").glob("*.pkl"))


def test_load_detects_corruption(tmp_path):
    save_lorsa(Lorsa(CFG), tmp_path / "l")
    w = tmp_path / "l" / "lorsa.safetensors"
    w.write_bytes(w.read_bytes()[:-8])
    with pytest.raises(CorruptFileError):
        load_lorsa(tmp_path / "l")
    with pytest.raises(CorruptFileError):
        load_lorsa(tmp_path / "missing")


def test_load_refuses_a_foreign_config(tmp_path):
    from rankwise.core.io import write_manifest

    save_lorsa(Lorsa(CFG), tmp_path / "l")
    cfg = tmp_path / "l" / "lorsa.json"
    cfg.write_text(json.dumps({"kind": "other", "version": 1}))
    write_manifest(tmp_path / "l")
    with pytest.raises(CorruptFileError, match="not a 'lorsa' config"):
        load_lorsa(tmp_path / "l")


def test_top_activating_contexts_finds_planted_activations():
    m = Lorsa(CFG).eval()
    x = torch.randn(6, 10, 12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        acts = m.sparse_activations(x)[..., 3]
    acts[:, 0] = 0
    found = top_activating_contexts(m, x, head=3, n=4)
    expected = acts.abs().flatten().topk(4).values
    # one batch of 6 windows (batch_size 16): the same call on the same tensor as above, so the same floats
    assert [abs(c.value) for c in found] == expected.tolist()
    for c in found:
        assert c.position >= 1 and 0 <= c.source <= c.position
        assert float(acts[c.window, c.position]) == c.value
    with pytest.raises(InvalidInputError, match="head"):
        top_activating_contexts(m, x, head=16)


def test_induction_score_and_previous_occurrence():
    tokens = torch.tensor([[0, 5, 6, 7, 5, 6, 7]])
    assert previous_occurrence(tokens).tolist() == [[-1, -1, -1, -1, 1, 2, 3]]
    T = 7
    perfect = torch.zeros(1, 2, T, T)
    perfect[0, 1] = torch.eye(T)  # head 1 attends to itself only
    for t, s in ((4, 2), (5, 3), (6, 4)):
        perfect[0, 0, t, s] = 1.0  # head 0: previous occurrence + 1
    for t in (0, 1, 2, 3):
        perfect[0, 0, t, t] = 1.0
    assert induction_score(perfect, tokens).tolist() == [1.0, 0.0]
    with pytest.raises(InvalidInputError, match="repeat"):
        induction_score(perfect, torch.tensor([[0, 1, 2, 3, 4, 5, 6]]))


def test_purity_and_mechanism_fractions():
    labels = torch.tensor([0, 0, 1, 1, -1, -1])
    acts = torch.tensor([[5., 1.], [4., 1.], [0., 3.], [0., 2.], [1., 9.], [0., 0.]])
    frac = mechanism_fractions(acts, labels, n_top=2)
    assert frac.tolist() == [[1.0, 0.0], [0.0, 0.5]]
    p, mech = purity(acts, labels, n_top=2)
    assert p.tolist() == [1.0, 0.5] and mech.tolist() == [0, 1]
