"""core.arms: extending a flagged grid (the protocol's rule, shared by the reproductions)."""

import math

import pytest



def test_a_flagged_grid_is_extended_until_the_choice_is_interior():
    from rankwise.core.arms import half_decade_neighbour, select_with_extension

    assert half_decade_neighbour(1e-3, True) == pytest.approx(3e-3, rel=1e-12) and half_decade_neighbour(1e-3, False) == pytest.approx(3e-4, rel=1e-12)
    seen = []
    score = lambda lr: (seen.append(lr), -abs(math.log10(lr) - math.log10(3e-2)))[1]  # optimum at 3e-2  # noqa: E731
    sel = select_with_extension((1e-3, 3e-3), score, True, "lr", max_extend=5)
    assert sel.chosen == pytest.approx(3e-2, rel=1e-12) and sel.edge is None and seen == pytest.approx([1e-3, 3e-3, 1e-2, 3e-2, 1e-1], rel=1e-12)
    capped = select_with_extension((1e-3, 3e-3), score, True, "lr", max_extend=1)
    assert capped.chosen == pytest.approx(1e-2, rel=1e-12) and capped.edge == "high"  # still flagged: the report says so
    doubled = select_with_extension((1.0, 2.0), lambda v: -abs(v - 8), True, "lr", 4, neighbour=lambda v, up: v * 2 if up else v / 2)
    assert doubled.chosen == 8.0


def test_grid_step_neighbour_extends_at_the_grids_own_step():
    from rankwise.core.arms import grid_step_neighbour, select_with_extension

    step = grid_step_neighbour((4e-4, 1e-4, 2e-4))  # unsorted: the step is 2 either way
    assert step(1e-4, False) == pytest.approx(5e-5, rel=1e-12) and step(4e-4, True) == pytest.approx(8e-4, rel=1e-12)
    assert grid_step_neighbour((0.1,))(0.1, True) == pytest.approx(0.3, rel=1e-12)  # one point: a factor of 3
    seen = []
    score = lambda lr: (seen.append(lr), abs(math.log2(lr / 1.25e-5)))[1]  # lowest at 1.25e-5, 3 steps below  # noqa: E731
    sel = select_with_extension((1e-4, 2e-4, 4e-4), score, False, "lr", max_extend=4, neighbour=grid_step_neighbour((1e-4, 2e-4, 4e-4)))
    assert sel.chosen == pytest.approx(1.25e-5, rel=1e-12) and sel.edge is None
    assert seen == pytest.approx([1e-4, 2e-4, 4e-4, 5e-5, 2.5e-5, 1.25e-5, 6.25e-6], rel=1e-12)
