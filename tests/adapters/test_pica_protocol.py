"""The PiCa reproduction's own machinery: the spectral-premise measurement (PiCa's share against the update's best
rank-r share, Eckart-Young) and the grid extension rule that makes every arm's grid bracket its optimum."""

import math

import pytest
import torch

from rankwise.errors import InvalidInputError
from rankwise.core.arms import select_with_extension
from rankwise.repro.pica.spectrum import update_energy

pytestmark = pytest.mark.method("pica")


def _orthonormal(n, k, seed):
    q, _ = torch.linalg.qr(torch.randn(n, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


def test_update_in_pretrained_top_subspace_reaches_the_optimum():
    # W0 with a known spectrum; an update whose row space is W0's top-3 right singular vectors: PiCa's share is the
    # whole energy, equal to the best rank-3 share (ratio 1), while a rank-3 update on the bottom vectors gets ~0.
    u, v = _orthonormal(20, 12, 0), _orthonormal(12, 12, 1)
    w0 = u @ torch.diag(torch.linspace(10, 1, 12, dtype=torch.float64)) @ v.T
    top = _orthonormal(20, 3, 2) @ torch.randn(3, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64) @ v[:, :3].T
    bottom = _orthonormal(20, 3, 4) @ v[:, -3:].T
    (e_top,) = update_energy({"a": w0}, {"a": w0 + 1e-2 * top}, (3,))
    (e_bot,) = update_energy({"a": w0}, {"a": w0 + 1e-2 * bottom}, (3,))
    assert e_top.best == pytest.approx(1.0, abs=1e-12) and e_top.ratio_to_best == pytest.approx(1.0, abs=1e-9)
    assert e_bot.best == pytest.approx(1.0, abs=1e-12) and e_bot.pica < 1e-9
    assert e_top.random == 3 / 12
    assert e_top.relative_update == pytest.approx(1e-2 * float(top.norm()) / float(w0.norm()))


def test_pica_share_never_exceeds_the_best_rank_r_share():
    gen = torch.Generator().manual_seed(7)
    w0 = torch.randn(16, 10, generator=gen, dtype=torch.float64)
    after = w0 + 0.1 * torch.randn(16, 10, generator=gen, dtype=torch.float64)
    for e in update_energy({"a": w0}, {"a": after}, (1, 4, 10)):
        assert e.pica <= e.best + 1e-12
    assert e.best == pytest.approx(1.0) and e.pica == pytest.approx(1.0)  # r = in: both subspaces are everything


def test_update_energy_refuses_unchanged_layers_and_bad_ranks():
    w = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(InvalidInputError, match="did not change"):
        update_energy({"a": w}, {"a": w.clone()}, (1,))
    with pytest.raises(InvalidInputError, match="rank"):
        update_energy({"a": w}, {"a": w + 1}, (4,))


@pytest.mark.parametrize("best,max_extend,expected_grid,edge", [
    (-2.5, 2, (1e-3, 3e-3, 1e-2), None),  # interior optimum: no extension
    (-1.0, 3, (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1), None),  # above the grid: extended up until 0.1 is interior
    (-1.0, 2, (1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "high"),  # out of extensions with the choice on the edge: flagged
    (-6.0, 2, (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), "low"),
])
def test_grid_is_extended_toward_an_edge_choice(best, max_extend, expected_grid, edge):
    calls = []

    def score(lr):
        calls.append(lr)
        return -abs(math.log10(lr) - best)

    sel = select_with_extension((1e-3, 3e-3, 1e-2), score, True, "lr", max_extend)
    assert sel.grid == pytest.approx(expected_grid) and len(calls) == len(expected_grid)
    assert sel.edge == edge
