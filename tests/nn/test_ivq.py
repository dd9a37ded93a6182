"""IVQ + Magnet layers: the card's invariants -- IVQ passes Z_p through unchanged, L_IVQ >= 0 and 0 at codewords,
the stop-gradients of both terms, explicit VQ's straight-through forward; Magnet rows sum to 1, prototypes are
A^T Z [B, K, D] and invariant to the order of patches; the effective rank on known spectra (identity, rank 1, a
constructed diagonal) in the authors' cumulative convention and the entropy one -- and bad input."""

import math

import pytest
import torch

from rankwise.core.rank_measures import effective_rank
from rankwise.errors import InvalidInputError, RankwiseError
from rankwise.nn.ivq import (ExplicitVQ, ImplicitVQ, MagnetAttention, barlow_loss, cumulative_rank, nearest_codes,
                             patch_rank, spectral_loss)

pytestmark = pytest.mark.method("ivq-concept-bottleneck")


def _z(b=2, l=5, d=4, seed=0):
    return torch.randn(b, l, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_ivq_passes_tokens_through_and_loss_is_the_card_formula():
    torch.manual_seed(0)
    q = ImplicitVQ(3, 4).double()
    z = _z()
    out = q(z)
    assert out.tokens is z  # Z_q is discarded: the forward path is Z_p itself
    zq = q.codebook[nearest_codes(z, q.codebook)]
    expected = ((z - zq) ** 2).mean() * (1 + q.beta)
    assert torch.allclose(out.loss, expected)
    assert float(out.loss.detach()) >= 0
    # the chosen codeword is the nearest one, by brute force
    d2 = ((z.unsqueeze(-2) - q.codebook) ** 2).sum(-1)
    assert torch.equal(out.codes, d2.argmin(-1))


def test_ivq_loss_is_zero_at_codewords():
    torch.manual_seed(1)
    q = ImplicitVQ(4, 6).double()
    z = q.codebook.detach()[torch.tensor([[0, 1, 3], [2, 2, 0]])]  # every token equals a codeword
    out = q(z)
    assert all(float(t.detach()) == 0.0 for t in (out.loss, out.codebook_loss, out.commitment_loss))


@pytest.mark.parametrize("term", ["codebook_loss", "commitment_loss"])
def test_stop_gradients(term):
    torch.manual_seed(2)
    q = ImplicitVQ(3, 4).double()
    z = _z().requires_grad_(True)
    getattr(q(z), term).backward()
    if term == "codebook_loss":  # ||sg(Z_p) - Z_q||^2 moves only the codebook
        assert z.grad is None or float(z.grad.abs().max()) == 0.0
        assert float(q.codebook.grad.abs().max()) > 0
    else:  # beta ||Z_p - sg(Z_q)||^2 moves only Z_p
        assert q.codebook.grad is None or float(q.codebook.grad.abs().max()) == 0.0
        assert float(z.grad.abs().max()) > 0


def test_frozen_codebook_is_not_trainable_and_keeps_the_uniform_init():
    q = ImplicitVQ(5, 8, frozen_codebook=True)
    assert not q.codebook.requires_grad
    assert float(q.codebook.abs().max()) <= 1 / 5


def test_explicit_vq_forwards_codewords_with_straight_through_gradient():
    torch.manual_seed(3)
    q = ExplicitVQ(3, 4).double()
    z = _z().requires_grad_(True)
    out = q(z)
    assert torch.allclose(out.tokens, q.codebook[out.codes])
    (out.tokens * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    # straight through: d tokens / d z is the identity; the loss is not in this backward
    assert torch.allclose(z.grad, torch.arange(4.0, dtype=torch.float64).expand_as(z))
    assert q.codebook.grad is None


def test_magnet_rows_sum_to_one_and_prototypes_are_a_transpose_z():
    torch.manual_seed(4)
    m = MagnetAttention(3, 4).double()
    z = _z()
    protos, a = m(z)
    assert protos.shape == (2, 3, 4) and a.shape == (2, 5, 3)
    assert torch.allclose(a.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    d2 = torch.cdist(z, m.queries.unsqueeze(0).expand(2, -1, -1)) ** 2
    assert torch.allclose(a, torch.softmax(-d2, -1))
    assert torch.allclose(protos, torch.einsum("blk,bld->bkd", a, z))  # a weighted sum, not a mean


def test_magnet_is_permutation_invariant_over_patches():
    torch.manual_seed(5)
    m = MagnetAttention(3, 4).double()
    z = _z(l=7)
    perm = torch.randperm(7)
    assert torch.allclose(m(z)[0], m(z[:, perm])[0])


def test_magnet_temperature_softens():
    torch.manual_seed(6)
    m1, m2 = MagnetAttention(3, 4).double(), MagnetAttention(3, 4, temperature=100.0).double()
    m2.load_state_dict(m1.state_dict())
    z = 3 * _z()
    with torch.no_grad():
        assert float(m2.assignments(z).max(-1).values.mean()) < float(m1.assignments(z).max(-1).values.mean())


def test_effective_rank_identity_rank_one_and_a_constructed_diagonal():
    n = 10
    eye = torch.linalg.svdvals(torch.eye(n, dtype=torch.float64))
    assert cumulative_rank(eye) == n - 1  # partial sums k/n; only the n-th (= 1) exceeds 0.99
    assert effective_rank(eye) == pytest.approx(n)
    rank1 = torch.linalg.svdvals(torch.outer(torch.arange(1.0, 6.0), torch.arange(1.0, 5.0)).double())
    assert cumulative_rank(rank1) == 0  # the first partial sum is already 1 (up to rounding)
    assert effective_rank(rank1) == pytest.approx(1.0, abs=1e-6)
    sigma = torch.tensor([50.0, 30, 10, 5, 4, 1], dtype=torch.float64)  # partial sums .5 .8 .9 .95 .99 1
    u, _ = torch.linalg.qr(torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    v, _ = torch.linalg.qr(torch.randn(7, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    mat = u @ torch.diag(sigma) @ v.T
    assert cumulative_rank(torch.linalg.svdvals(mat)) == 5
    p = sigma / sigma.sum()
    assert effective_rank(torch.linalg.svdvals(mat)) == pytest.approx(math.exp(float(-(p * p.log()).sum())), rel=1e-9)


def test_patch_rank_is_the_batch_mean():
    eye = torch.eye(6, dtype=torch.float64)
    one = torch.zeros(6, 6, dtype=torch.float64)
    one[:, 0] = 1.0
    reading = patch_rank(torch.stack([eye, one]))
    assert reading.cumulative == pytest.approx((5 + 0) / 2)
    assert reading.entropy == pytest.approx((6 + 1) / 2)
    assert reading.max_rank == 6


def test_diversity_regularisers():
    eye = torch.eye(4, dtype=torch.float64).unsqueeze(0)
    assert float(spectral_loss(eye)) == pytest.approx(-1.0)  # flat spectrum
    one = torch.ones(1, 4, 4, dtype=torch.float64)
    assert float(spectral_loss(one)) == pytest.approx(-0.5)  # rank 1: 1 / sqrt(4)
    z = _z(b=3, l=64, d=3)
    assert float(barlow_loss(z)) >= 0
    corr = torch.cat([z[..., :1], z[..., :1], z[..., 2:]], -1)  # two identical dimensions
    assert float(barlow_loss(corr)) > float(barlow_loss(z))


@pytest.mark.parametrize("bad", [torch.randn(5, 4), torch.randn(2, 5, 3), torch.randn(2, 0, 4),
                                 torch.randint(0, 3, (2, 5, 4))])
def test_bad_tokens_are_refused(bad):
    with pytest.raises(InvalidInputError):
        ImplicitVQ(3, 4)(bad)
    with pytest.raises(InvalidInputError):
        MagnetAttention(3, 4)(bad)


def test_bad_construction_is_refused():
    for make in (lambda: ImplicitVQ(0, 4), lambda: ImplicitVQ(3, 4, beta=-1), lambda: MagnetAttention(0, 4),
                 lambda: MagnetAttention(3, 4, temperature=0), lambda: cumulative_rank(torch.ones(3), 1.5),
                 lambda: patch_rank(torch.ones(3, 3))):
        with pytest.raises(RankwiseError):
            make()


def test_explicit_vq_equals_the_vector_quantize_pytorch_peer():
    """The explicit-VQ arm against vector-quantize-pytorch (the issue's peer) on one codebook: the same nearest codes,
    the same quantised tokens forwarded (straight-through), and the commitment term equal to its MSE."""
    vqp = pytest.importorskip("vector_quantize_pytorch")
    from rankwise.nn.ivq import ExplicitVQ

    torch.manual_seed(0)
    M, D = 5, 8
    ours = ExplicitVQ(M, D)
    peer = vqp.VectorQuantize(dim=D, codebook_size=M, commitment_weight=1.0, learnable_codebook=True,
                              ema_update=False, kmeans_init=False).eval()
    with torch.no_grad():
        peer._codebook.embed.copy_(ours.codebook.detach()[None])
    z = torch.randn(3, 7, D, dtype=torch.float32)
    out = ours(z)
    quantized, indices, _ = peer(z)
    assert torch.equal(out.codes, indices)
    torch.testing.assert_close(out.tokens, quantized, rtol=0, atol=4 * 2**-24 * float(z.abs().max()))
    mse = torch.mean((z - ours.codebook.detach()[out.codes]) ** 2)
    torch.testing.assert_close(out.commitment_loss, mse, rtol=1e-6, atol=0)
