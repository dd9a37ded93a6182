"""The rank-bottleneck testbed of `lmao:digits`: its splits, its mirrored pretraining task and its arms' wiring."""

from __future__ import annotations

import pytest
import torch

from rankwise.repro.lmao.arms import FULL_FT, LMAO, LORA, MEZO
from rankwise.repro.lmao.digits import SIZES, DigitsMLP, digits_splits, fit, pretrain
from rankwise.training.cached_classification import CachedClassificationTask

pytestmark = pytest.mark.method("lmao")


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.reshape(x.shape[0], -1)}


def test_splits_are_disjoint_cover_digits_and_the_pretraining_images_are_the_training_images_mirrored():
    data = digits_splits((297, 500), seed=3)
    sizes = {k: len(data[k].labels) for k in ("train", "val", "test")}
    assert sizes == {"train": 1797 - 797, "val": 297, "test": 500}
    from sklearn.datasets import load_digits

    every = _rows(torch.tensor(load_digits().data, dtype=torch.float32) / 16.0)
    assert set().union(*(_rows(data[k].h) for k in ("train", "val", "test"))) == every  # the three cover digits
    mirrored = data["mirrored"].h.view(-1, 8, 8)
    assert torch.equal(mirrored.flip(-1), data["train"].h.view(-1, 8, 8))  # a mirror, undone by mirroring again
    assert not torch.equal(mirrored, data["train"].h.view(-1, 8, 8))
    assert torch.equal(data["mirrored"].labels, data["train"].labels)
    assert float(data["train"].h.min()) >= 0.0 and float(data["train"].h.max()) <= 1.0
    assert digits_splits((297, 500), seed=3)["test"].labels.tolist() == data["test"].labels.tolist()


def test_pretraining_is_deterministic_and_every_arm_starts_from_the_backbone_unchanged():
    s = SIZES["smoke"]
    data = digits_splits(s.split, seed=0)
    a, b = pretrain(data, 5, 16, seed=0), pretrain(data, 5, 16, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    before = {k: v.clone() for k, v in a.state_dict().items()}
    task = CachedClassificationTask(data["train"], data["val"], "digits")
    for arm in (LORA, LMAO, MEZO, FULL_FT):
        f = fit(arm, a, task, s, seed=1, lr=1e-3, base_lr=1e-4)
        assert 0.0 <= f.accuracy <= 1.0
        if arm == LMAO:  # the ZO phase moved every frozen 2-D tensor (fc1, fc2) of the copy
            assert sorted(f.base_delta) == ["body.fc1.base_layer.weight", "body.fc2.base_layer.weight"]
            assert all(float(d.abs().max()) > 0 for d in f.base_delta.values())
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())  # the backbone itself is never trained


def test_the_mlp_reads_the_cached_layout():
    m = DigitsMLP()
    assert m(torch.rand(5, 1, 64), torch.ones(5, 1)).shape == (5, 10)
