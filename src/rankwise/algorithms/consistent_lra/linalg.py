"""Float64 linear algebra of a row stream: prefix Gram matrices, top-k subspaces, tail energies, projector distances.

A rank-k subspace is an orthonormal basis `V` [k, d] (rows are the basis vectors), its projector `P = V^T V`. For a
prefix `A^(t)` of the stream with Gram matrix `G_t = A^(t)T A^(t)` [d, d] and `F_t = ||A^(t)||_F^2 = tr G_t`:

    cost_t(V) = ||A^(t) - A^(t) V^T V||_F^2 = F_t - tr(V G_t V^T)
    OPT_t     = sum of all but the k largest eigenvalues of G_t

so everything the guarantees need is read from the Gram matrix, which a stream keeps in O(d^2) memory.
"""

from __future__ import annotations

import torch

EPS64 = torch.finfo(torch.float64).eps
# Prefix Gram stacks are [c, d, d] float64; c is chosen so one stack stays near this many bytes.
CHUNK_BYTES = 32 * 2**20
MAX_CHUNK = 256


def chunk_length(dim: int) -> int:
    """How many rows' prefix Gram matrices [c, d, d] to hold at once (about CHUNK_BYTES of float64)."""
    return max(1, min(MAX_CHUNK, CHUNK_BYTES // (8 * dim * dim)))


def prefix_grams(gram: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`G + sum_{i<=j} a_i^T a_i` for every j: gram [d, d], rows [c, d] -> [c, d, d] (float64)."""
    return gram + torch.cumsum(rows[:, :, None] * rows[:, None, :], dim=0)


def top_k_basis(gram: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k eigenvectors of symmetric PSD `gram` [..., d, d] as orthonormal rows [..., k, d], and all eigenvalues
    [..., d] ascending. Eigenvectors of a rank-deficient Gram beyond its rank are an arbitrary orthonormal completion."""
    values, vectors = torch.linalg.eigh(gram)
    return vectors[..., -k:].transpose(-1, -2), values


def tail_energy(eigenvalues: torch.Tensor, k: int) -> torch.Tensor:
    """OPT: the sum of all but the k largest of the ascending `eigenvalues` [..., d] (rounding negatives count as 0)."""
    d = eigenvalues.shape[-1]
    return eigenvalues[..., : d - k].clamp_min(0).sum(-1)


def captured_energy(basis: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """`tr(V G V^T)`: basis [..., k, d], gram [..., d, d] -> [...] (broadcast over leading dimensions)."""
    return ((basis @ gram) * basis).sum((-1, -2))


def projector_distance(v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
    """`||P1 - P2||_F^2 = 2 (k - ||V1 V2^T||_F^2) = 2 sum_i sin^2(theta_i)` in [0, 2k], for bases [..., k, d].

    Independent of the choice of basis (V -> QV with Q orthogonal leaves it unchanged); rounding below 0 reads 0.
    """
    k = v1.shape[-2]
    overlap = (v1 @ v2.transpose(-1, -2)).pow(2).sum((-1, -2))
    return (2.0 * (k - overlap)).clamp(0.0, 2.0 * k)


def rounding_slack(frob2: torch.Tensor, dim: int, steps: torch.Tensor) -> torch.Tensor:
    """Absolute float64 tolerance of a cost or OPT at step t: `8 eps (d + t) F_t`.

    A cost is `F_t` minus a sum of t projected row norms (or an eigenvalue sum of a d x d matrix): each loses up to
    about (number of terms) x eps x F_t to rounding. Guarantee checks add this so that OPT_t = 0 (t <= k) is
    decidable: a subspace holding every row so far must pass, one that misses a row must not.
    """
    return 8.0 * EPS64 * (dim + steps.to(torch.float64)) * frob2


def change_tolerance(rank: int, dim: int) -> float:
    """A step whose projector distance is below this is not counted as a change of subspace (rounding of the
    k x k overlap of two float64 bases)."""
    return 16.0 * rank * dim * EPS64


def prefix_optimal_cost(rows: torch.Tensor, rank: int, gram: torch.Tensor | None = None) -> torch.Tensor:
    """OPT_t, the optimal rank-k cost of every prefix of `rows` [n, d] (after `gram`, default zero): [n] float64.

    One symmetric eigenvalue problem per row, batched over chunks of rows; the reference every guarantee is checked
    against. Non-decreasing in t (up to rounding).
    """
    rows = rows.to(torch.float64)
    d = rows.shape[1]
    g = torch.zeros(d, d, dtype=torch.float64) if gram is None else gram.to(torch.float64)
    out = []
    step = chunk_length(d)
    for start in range(0, rows.shape[0], step):
        grams = prefix_grams(g, rows[start:start + step])
        out.append(tail_energy(torch.linalg.eigvalsh(grams), rank))
        g = grams[-1]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)
