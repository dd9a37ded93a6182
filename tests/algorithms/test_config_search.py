"""CoA-LoRA's search pieces: segmented Pareto filter vs brute force, ILP allocation vs brute force, proposals."""

import itertools

import numpy as np
import pytest

from rankwise.algorithms.config_search import allocate_bits, hypervolume_2d, nondominated, propose_configurations, segmented_pareto
from rankwise.errors import InvalidInputError

pytestmark = pytest.mark.method("coa-lora")


def _brute_front(b, l, idx):
    return sorted(i for i in idx if not any(b[j] <= b[i] and l[j] <= l[i] and (b[j] < b[i] or l[j] < l[i]) for j in idx))


@pytest.mark.parametrize("seed", range(5))
def test_segmented_pareto_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    b = np.round(rng.uniform(2.0, 7.0, 80), 2)  # rounding makes ties of bits
    l = np.round(rng.uniform(0, 1, 80), 2)
    expected = []
    for k in range(17):
        lo, hi = 2.25 + 0.25 * k, 2.25 + 0.25 * (k + 1)
        members = [i for i in range(80) if lo <= b[i] < hi or (k == 16 and b[i] == 6.5)]
        expected += _brute_front(b, l, members)
    assert segmented_pareto(b, l) == sorted(expected)
    assert nondominated(b, l) == _brute_front(b, l, range(80))


def test_hypervolume_by_hand():
    assert hypervolume_2d([1, 2], [0.5, 0.8], 4, 0) == pytest.approx(0.5 + 2 * 0.8)
    assert hypervolume_2d([1, 2], [0.8, 0.5], 4, 0) == pytest.approx(3 * 0.8)  # the dominated point adds nothing


def test_ilp_allocation_equals_brute_force():
    rng = np.random.default_rng(0)
    err, bits, sizes = rng.uniform(0, 1, (4, 3)), np.array([2.1, 3.1, 4.1]), [1, 3, 2, 2]
    for budget in (2.2, 2.8, 3.3, 4.2):
        feasible = [o for o in itertools.product(range(3), repeat=4)
                    if sum(s * bits[k] for s, k in zip(sizes, o)) <= budget * sum(sizes) + 1e-9]
        best = min(feasible, key=lambda o: sum(err[i, k] for i, k in enumerate(o)))
        assert tuple(allocate_bits(err, bits, sizes, budget)) == best
    assert allocate_bits(err, bits, sizes, 2.0) is None


def test_ilp_allocation_prints_nothing(capfd):
    """HiGHS 1.12 printf()s a debug line when it repairs a presolved integer solution, as on this instance (capfd:
    the line is written by C code to file descriptor 1, below sys.stdout); the allocation silences it."""
    rng = np.random.default_rng(0)
    bits = np.sort(rng.uniform(2, 9, 6))
    err = np.exp(-bits[None, :] * rng.uniform(0.5, 1.5, (6, 1))) * rng.uniform(0.1, 10, (6, 1)) * rng.uniform(0.9, 1.1, (6, 6))
    sizes = rng.integers(1000, 2_000_000, 6)
    print("before")
    assert allocate_bits(err, bits, sizes, 4.75) == [2, 0, 3, 2, 2, 4]
    print("after")  # stdout works again after the solve
    assert capfd.readouterr().out == "before\nafter\n"


def test_proposals_are_new_in_bounds_and_deterministic():
    rng = np.random.default_rng(1)
    cards = np.array([4, 2, 3] * 3)
    x = np.stack([rng.integers(0, c, 30) for c in cards], 1)
    bits = x[:, ::3].mean(1) + 2
    loss = 1 / bits + rng.normal(0, 0.01, 30)
    # two short climbs and 16 MC samples: the invariants do not depend on the search's length (and it is ~4x faster)
    p = propose_configurations(x, cards, bits, loss, n_starts=2, max_steps=3, seed=7, mc_samples=16)
    q = propose_configurations(x, cards, bits, loss, n_starts=2, max_steps=3, seed=7, mc_samples=16)
    assert np.array_equal(p.candidates, q.candidates)
    assert np.all(p.candidates >= 0) and np.all(p.candidates < cards)
    archived = {tuple(r) for r in x.tolist()}
    assert all(tuple(c) not in archived for c in p.candidates.tolist())
    with pytest.raises(InvalidInputError, match="0 <= x_j"):
        propose_configurations(x + 5, cards, bits, loss)
