"""PFT (pft-fer): the card's invariants — F, B and C get no gradients in either stage, T at identity leaves the
predictions unchanged and L_expr = 0, the Gram matrix is symmetric PSD of the expected shape, the style loss is 0
for identical statistics, stage 2 receives no expressive frame — plus the face renderer's determinism and bad input
refused before work."""

import pytest
import torch
from torch import nn

from rankwise.apps.vision.pft import (FeatureTranslator, PftConfig, SourceModel, TranslatedModel, as_source_model,
                                      cosine_partners, emotion_loss, gram_loss, gram_matrix, moment_loss, personalise,
                                      pretrain_translator, scores, style_loss)
from rankwise.data.faces import EXPRESSIVE, NEUTRAL, render_faces, sample_subjects
from rankwise.errors import InvalidInputError, RankwiseError

pytestmark = pytest.mark.method("pft-fer")


def tiny_model(seed: int = 0) -> SourceModel:
    torch.manual_seed(seed)
    features = nn.Sequential(nn.Conv2d(1, 4, 5, 4, 2), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return SourceModel(features, nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)),
                       nn.utils.parametrizations.weight_norm(nn.Linear(6, 2))).eval()


@pytest.fixture(scope="module")
def faces():
    return render_faces(sample_subjects(3, seed=1), per_class=4, seed=2)


# -- the renderer ----------------------------------------------------------------------------------------------------
def test_renderer_is_deterministic_and_in_range(faces):
    again = render_faces(sample_subjects(3, seed=1), per_class=4, seed=2)
    assert torch.equal(faces.images, again.images) and torch.equal(faces.labels, again.labels)
    other = render_faces(sample_subjects(3, seed=1), per_class=4, seed=3)
    assert not torch.equal(faces.images, other.images)
    assert faces.images.shape == (24, 1, 48, 48) and faces.images.dtype == torch.float32
    assert float(faces.images.min()) >= 0 and float(faces.images.max()) <= 1
    assert faces.labels.tolist() == ([NEUTRAL] * 4 + [EXPRESSIVE] * 4) * 3
    # expressive frames carry action units, neutral ones almost none
    assert float(faces.action_units[faces.labels == 1].mean()) > 3 * float(faces.action_units[faces.labels == 0].mean())


def test_renderer_bad_input():
    with pytest.raises(InvalidInputError):
        sample_subjects(0)
    with pytest.raises(InvalidInputError):
        render_faces(sample_subjects(1), per_class=0)
    with pytest.raises(InvalidInputError):
        render_faces(sample_subjects(1), per_class=1, labels=(2,))


# -- losses ----------------------------------------------------------------------------------------------------------
def test_gram_matrix_symmetric_psd_shapes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 7, generator=g, dtype=torch.float64)
    G = gram_matrix(x)
    assert G.shape == (7, 7)
    assert torch.allclose(G, G.T)
    assert float(torch.linalg.eigvalsh(G).min()) > -1e-12
    maps = gram_matrix(torch.randn(3, 5, 4, 4, generator=g, dtype=torch.float64))
    assert maps.shape == (3, 5, 5) and torch.allclose(maps, maps.transpose(1, 2))
    assert float(torch.linalg.eigvalsh(maps).min()) > -1e-12
    with pytest.raises(InvalidInputError):
        gram_matrix(torch.randn(3))


def test_style_losses_zero_for_identical_statistics_and_positive_otherwise():
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(1))
    perm = x[torch.randperm(16)]  # same batch statistics, different order
    assert float(style_loss(perm, x)) < 1e-12 and float(gram_loss(perm, x)) < 1e-12 and float(moment_loss(x, perm)) < 1e-12
    assert float(style_loss(x * 2 + 1, x)) > 0.1 and float(gram_loss(x * 2 + 1, x)) > 0.1


def test_emotion_loss_zero_at_identity_for_every_kind():
    logits = torch.randn(8, 2, generator=torch.Generator().manual_seed(2))
    for kind in ("ce", "mse", "kl"):
        assert abs(float(emotion_loss(logits, logits.clone(), kind))) < 1e-6
        assert float(emotion_loss(logits, -logits, kind)) > 0
    with pytest.raises(InvalidInputError):
        emotion_loss(logits, logits, "l1")


def test_cosine_partners_respect_labels():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pool = torch.tensor([[0.9, 0.1], [1.0, 0.05], [0.1, 1.0]])
    got = cosine_partners(q, torch.tensor([0, 0]), pool, torch.tensor([1, 0, 0]))
    assert got.tolist() == [1, 2]  # the first query's nearest (index 0) has the other label
    with pytest.raises(InvalidInputError):
        cosine_partners(q, torch.tensor([0, 1]), pool, torch.tensor([0, 0, 0]))


# -- the translator and both stages ----------------------------------------------------------------------------------
def test_identity_translator_leaves_predictions_unchanged(faces):
    model = tiny_model()
    t = FeatureTranslator(4)
    with torch.no_grad():
        f = model.features(faces.images)
        assert torch.equal(t(f), f)
        assert torch.equal(TranslatedModel(model, t)(faces.images), model(faces.images))
        assert abs(float(emotion_loss(model.head(f), model.head(t(f))))) < 1e-6


def test_no_gradients_reach_f_b_c_in_either_stage(faces, monkeypatch):
    import rankwise.apps.vision.pft.adapt as adapt

    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copies = []
    real = adapt.frozen_copy
    monkeypatch.setattr(adapt, "frozen_copy", lambda m: copies.append(real(m)) or copies[-1])
    t = pretrain_translator(model, faces.images, faces.labels, faces.subjects, PftConfig(pretrain_steps=4, batch_size=4))
    neutral = faces.images[faces.labels == NEUTRAL]
    result = personalise(model, neutral, PftConfig(steps=4, batch_size=4), translator=t)
    assert len(copies) == 2
    for frozen in copies:
        assert all(not p.requires_grad and p.grad is None for p in frozen.parameters())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the translator did train
    assert not torch.equal(result.model.translator.outer.weight, torch.zeros_like(result.model.translator.outer.weight))
    assert all(p.grad is None or not p.requires_grad for p in result.model.source.parameters())


def test_stage2_receives_no_expressive_frame(faces):
    model = tiny_model()
    neutral_mask = faces.labels == NEUTRAL
    got = []
    personalise(model, faces.images[neutral_mask], PftConfig(steps=2, batch_size=4), labels=faces.labels[neutral_mask],
                observer=lambda images, labels: got.append((images, labels)))
    (images, labels), = got
    assert labels.numel() == int(neutral_mask.sum()) and bool((labels == NEUTRAL).all())
    # exactly the neutral frames, none of the expressive ones
    expressive = faces.images[~neutral_mask]
    assert not any(bool((img == expressive).flatten(1).all(1).any()) for img in images)


def test_bad_input_refused_before_work(faces):
    model = tiny_model()
    neutral = faces.images[faces.labels == NEUTRAL]
    calls = []
    spy = lambda *a: calls.append(a)  # noqa: E731
    for bad, kwargs in [
        (neutral[:0], {}),                                            # empty target set
        (neutral[:, :, :40], {"config": PftConfig(image_shape=(1, 48, 48))}),  # wrong shape
        (neutral[:, 0], {}),                                          # not [N, C, H, W]
        (neutral * 255, {}),                                          # wrong range
        (neutral, {"labels": torch.ones(neutral.shape[0], dtype=torch.int64)}),  # labels not all neutral
        (torch.rand(2, 3, 48, 48), {}),                               # channels the model cannot read
    ]:
        with pytest.raises(RankwiseError):
            personalise(model, bad, observer=spy, **kwargs)
    assert calls == []
    with pytest.raises(InvalidInputError):
        personalise(nn.Sequential(nn.Flatten(), nn.ReLU()), neutral)  # no classifier layer
    with pytest.raises(InvalidInputError):
        as_source_model(nn.Conv2d(1, 2, 3))
    with pytest.raises(InvalidInputError):
        PftConfig(emotion="nope").validate()


def test_sequential_model_accepted(faces):
    seq = nn.Sequential(nn.Flatten(), nn.Linear(48 * 48, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    neutral = faces.images[faces.labels == NEUTRAL]
    out = personalise(seq, neutral, PftConfig(steps=2, batch_size=4)).model
    assert out(neutral).shape == (neutral.shape[0], 2)


def test_scores():
    s = scores(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 1]))
    assert s["accuracy"] == 75.0 and abs(s["expressive_recall"] - 200 / 3) < 1e-9 and s["neutral_recall"] == 100.0
    assert scores(torch.zeros(4, dtype=torch.int64), torch.tensor([0, 0, 1, 1]))["macro_f1"] < 50


def test_smoke_reproduction_is_deterministic(smoke_report):
    from rankwise.repro import run_reproduction

    a = smoke_report("pft-fer:main")
    b = run_reproduction("pft-fer", "smoke", seed=0)
    assert [c.measured for c in a.claims] == [c.measured for c in b.claims]
