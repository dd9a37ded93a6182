"""The concept bottleneck model: IVQ on/off gives identical logits for identical weights, prototype k scores only
its own group's texts, shapes, training with the one loop (rank curve per epoch, the codebook trained or frozen as
asked), and bad input (images of the wrong shape or range, a group with no values, K mismatches) refused first."""

import copy
import dataclasses

import pytest
import torch

from rankwise.apps.vision.cbm import CBMConfig, ConceptBottleneckModel, ConceptGroups, LabelledConcepts, evaluate_cbm, fit_cbm
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.models.vision import TinyViT

pytestmark = pytest.mark.method("ivq-concept-bottleneck")

VALUES = (("a", "b", "c"), ("x", "y"))


def _groups(e=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ConceptGroups(("g1", "g2"), VALUES, tuple(torch.randn(len(v), e, generator=g) for v in VALUES))


def _backbone():
    torch.manual_seed(0)
    return TinyViT(num_classes=2, image_size=8, patch_size=4, in_channels=3, dim=16, depth=1, heads=2, mlp_dim=32)


def _data(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    concepts = torch.stack([torch.randint(0, 3, (n,), generator=g), torch.randint(0, 2, (n,), generator=g)], 1)
    return LabelledConcepts(torch.rand(n, 3, 8, 8, generator=g), concepts[:, 1].clone(), concepts)


def _model(**options):
    torch.manual_seed(1)
    return ConceptBottleneckModel(_backbone(), _groups(), 2, CBMConfig(**options))


def test_ivq_on_or_off_gives_identical_logits():
    on = _model(regulariser="ivq").eval()
    off = ConceptBottleneckModel(_backbone(), _groups(), 2, CBMConfig(regulariser="none")).eval()
    off.load_state_dict({k: v for k, v in on.state_dict().items() if not k.startswith("quantizer.")})
    x = _data().images
    assert torch.equal(on(x), off(x))
    with torch.no_grad():
        assert float(on.outputs(x).reg_loss) > 0 and float(off.outputs(x).reg_loss) == 0


def test_shapes_and_each_prototype_scores_only_its_group():
    m = _model().eval()
    x = _data(n=5).images
    out = m.outputs(x)
    assert out.logits.shape == (5, 2) and out.concept_scores.shape == (5, 5) and out.patches.shape == (5, 4, 16)
    assert out.assignments.shape == (5, 4, 2)
    g = _groups()
    changed = ConceptGroups(g.names, g.values, (g.embeddings[0], torch.randn(2, 6)))
    m2 = copy.deepcopy(m)
    m2.text = torch.cat([torch.nn.functional.normalize(e, dim=-1) for e in changed.embeddings])
    s1, s2 = m.outputs(x).concept_scores, m2.outputs(x).concept_scores
    assert torch.equal(s1[:, :3], s2[:, :3]) and not torch.allclose(s1[:, 3:], s2[:, 3:])


@pytest.mark.parametrize("options", [{}, {"regulariser": "explicit-vq"}, {"regulariser": "spectral"},
                                     {"regulariser": "barlow"}, {"pooling": "cls", "head": "linear", "regulariser": "none"},
                                     {"pooling": "cls", "head": "text", "regulariser": "none", "label_free": True,
                                      "freeze_backbone": True}])
def test_fit_runs_and_reads_the_rank_every_epoch(options):
    m = _model(epochs=2, batch_size=8, rank_probe=6, **options)
    before = copy.deepcopy(m.backbone.state_dict())
    r = fit_cbm(m, _data(), _data(n=12, seed=1))
    assert [c["epoch"] for c in r.rank_curve] == [0, 1, 2]
    assert set(r.val) >= {"class_acc", "class_bmac", "concept_acc", "concept_bmac"}
    changed = any(not torch.equal(before[k], v) for k, v in m.backbone.state_dict().items())
    assert changed == (not options.get("freeze_backbone", False))


@pytest.mark.parametrize("frozen", [False, True])
def test_codebook_is_trained_unless_frozen(frozen):
    m = _model(epochs=1, batch_size=8, frozen_codebook=frozen)
    before = m.quantizer.codebook.detach().clone()
    fit_cbm(m, _data(), _data(n=12, seed=1))
    assert torch.equal(before, m.quantizer.codebook.detach()) == frozen


def test_evaluate_reports_points():
    metrics = evaluate_cbm(_model(), _data())
    for k in ("class_acc", "concept_acc", "concept_bmac"):
        assert 0 <= metrics[k] <= 100


def test_bad_images_are_refused():
    m = _model()
    for bad in (torch.rand(2, 1, 8, 8), torch.rand(2, 3, 16, 16), torch.rand(3, 8, 8), 255 * torch.rand(2, 3, 8, 8),
                -torch.rand(2, 3, 8, 8), torch.randint(0, 2, (2, 3, 8, 8))):
        with pytest.raises(InvalidInputError):
            m(bad)
    d = _data()
    with pytest.raises(InvalidInputError):
        fit_cbm(_model(epochs=1), dataclasses.replace(d, images=d.images * 255), _data(n=12, seed=1))


def test_bad_groups_and_k_mismatch_are_refused():
    e = torch.randn(3, 6)
    with pytest.raises(InvalidInputError, match="no values"):
        ConceptGroups(("g1", "g2"), (("a", "b", "c"), ()), (e, torch.randn(0, 6)))
    with pytest.raises(InvalidInputError, match="K Magnet queries"):
        ConceptGroups(("g1", "g2"), VALUES, (e,))
    with pytest.raises(InvalidInputError):
        ConceptGroups(("g1", "g2"), VALUES, (e, torch.randn(3, 6)))  # 3 texts for 2 values
    with pytest.raises(InvalidInputError, match="queries"):
        ConceptBottleneckModel(_backbone(), _groups(), 2, CBMConfig(), num_queries=3)


def test_bad_labels_and_options_are_refused():
    d = _data()
    bad = dataclasses.replace(d, concepts=d.concepts + torch.tensor([0, 5]))
    with pytest.raises(InvalidInputError):
        fit_cbm(_model(epochs=1), bad, _data(n=12, seed=1))
    for options in ({"pooling": "mean"}, {"regulariser": "l2"}, {"pooling": "magnet", "head": "linear"},
                    {"pooling": "cls", "regulariser": "explicit-vq", "head": "text"}, {"lr": 0}, {"epochs": 0}):
        with pytest.raises(RankwiseError):
            CBMConfig(**options).validate()
