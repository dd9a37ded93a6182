from pathlib import Path

import pytest

from rankwise.errors import UnknownNameError
from rankwise.registry import FAMILIES, METHODS, Method, get_method, readme_with_table, repo_root

CARDS = Path(__file__).resolve().parents[2] / "shared" / "methods"


def test_one_entry_per_card():
    assert len(METHODS) == 38
    assert len({m.slug for m in METHODS}) == 38
    assert all(m.family in FAMILIES and m.title for m in METHODS)
    if CARDS.is_dir():
        assert {p.stem for p in CARDS.glob("*.md")} == {m.slug for m in METHODS}


def test_status_is_computed_from_what_exists():
    ghost = Method("ghost", "t", "theory", ("rankwise.nothing_here:fn",))
    assert ghost.status == "planned"
    no_api = Method("ghost", "t", "theory", ())
    assert no_api.status == "planned"
    for m in METHODS:
        assert m.status in ("planned", "implemented", "reproduced")
        if m.status != "planned":
            assert m.has_api() and m.has_reproduction() and m.has_tests()


def test_unknown_slug():
    with pytest.raises(UnknownNameError, match="rankwise list"):
        get_method("not-a-method")


def test_readme_method_table_is_up_to_date():
    """The README's table is generated; regenerate with `rankwise list --update-readme`."""
    readme = (repo_root() / "README.md").read_text()
    assert readme == readme_with_table(readme), "README method table is stale: run `rankwise list --update-readme`"
