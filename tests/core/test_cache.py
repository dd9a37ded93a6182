

def test_clear_touches_only_what_rankwise_wrote(tmp_path, monkeypatch):
    """A cache root set to a home-like folder: `cache clear` refuses a root without the marker and, in a marked one,
    lists and removes only entries with a rankwise manifest (a user's files and other tools' folders stay)."""
    from rankwise.cli import main
    from rankwise.core.cache import ROOT_MARKER, cache_entries, store_entry

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret")
    (home / "notes").mkdir()
    (home / "notes" / "thesis.md").write_text("my work")
    (home / "project" / "src").mkdir(parents=True)
    monkeypatch.setenv("RANKWISE_CACHE", str(home))
    assert main(["--quiet", "cache", "clear"]) == 2  # no marker: not a rankwise cache
    assert (home / ".ssh" / "id_ed25519").is_file() and (home / "notes" / "thesis.md").is_file()
    assert cache_entries() == []  # nothing of theirs is an entry
    entry = store_entry("calibration", "k1", lambda tmp: (tmp / "stats.json").write_text("{}"))  # marks the root
    assert (home / ROOT_MARKER).is_file()
    assert [e.path for e in cache_entries()] == [entry]
    assert main(["--quiet", "cache", "clear"]) == 0
    assert not entry.exists()
    assert (home / ".ssh" / "id_ed25519").read_text() == "secret" and (home / "notes" / "thesis.md").read_text() == "my work"
    assert (home / "project" / "src").is_dir()
