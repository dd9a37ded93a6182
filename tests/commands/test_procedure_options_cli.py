"""`rankwise finetune --procedure NAME --procedure-option KEY=VALUE`: a bad option (unknown key, a value of the wrong
type or out of range, a missing required one) is refused before any model is loaded."""

import pytest

from rankwise.cli import main

ARGS = ["--quiet", "finetune", "--model", "minilm-l6", "--task", "wiki-topics", "--method", "lora", "--rank", "2",
        "--steps", "2", "--checkpoint-every", "0"]


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the refusal must come first."""
    import rankwise.models

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the procedure options were checked")

    monkeypatch.setattr(rankwise.models, "load_model", refuse)


def _case(procedure, options, match, slug=None):
    return pytest.param(procedure, options, match, marks=pytest.mark.method(slug or procedure), id=f"{procedure}:{match}")


@pytest.mark.parametrize("procedure, options, match", [
    _case("lmao", ["zo_lr=1e-6"], "has no option(s) ['zo_lr']"),
    _case("lmao", ["base_lr=fast"], "option base_lr must be int or float, got 'fast'"),
    _case("lmao", ["base_lr=True"], "option base_lr must be int or float, got True"),
    _case("lmao", ["base_lr=-1"], "base_lr must be a finite number >= 0"),
    _case("lmao", ["params=some"], "option params must be one of"),
    _case("peso", [], "needs --procedure-option previous=PREV_OUT/adapter"),
    _case("peso", ["previous=/nonexistent/adapter"], "not a folder"),
    _case("peso", ["previous={tmp}", "proximal=fisher"], "option proximal must be one of ['kl', 'l2']"),
    _case("peso", ["previous={tmp}", "lam=-1"], "lam must be a finite number >= 0"),
    _case("car-lora", ["operators=int8,bogus"], "unknown compression operator", slug="portable-adapter"),
    _case("car-lora", ["layers=1.5"], "option layers must be int or str or list or tuple", slug="portable-adapter"),
    _case("coa-lora", ["search=grid"], "option search must be one of"),
    _case("coa-lora", ["search_every=0"], "search_every must be an integer >= 1"),
    _case("coa-lora", ["budgets=(3, 2, 0.1)"], "(low, high, step)"),
    _case("la-lora", ["colour=blue"], "has no option(s) ['colour']"),
    _case("la-lora", ["rounds=two"], "option rounds must be int, got 'two'"),
    _case("la-lora", ["arm=fedsa"], "option arm must be one of"),
    _case("la-lora", ["clients=0"], "clients must be at least 1"),
    _case("la-lora", ["beta=-0.5"], "beta must be > 0 (Dirichlet) or 0 (IID)"),
    _case("la-lora", ["epsilon=3", "noise_multiplier=1.0"], "not both"),
])
def test_a_bad_procedure_option_is_refused_before_the_model_loads(no_model_load, tmp_path, capsys, procedure, options, match):
    flags = [x for o in options for x in ("--procedure-option", o.format(tmp=tmp_path))]
    assert main([*ARGS, "--procedure", procedure, *flags, "--out", str(tmp_path / "run")]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing written either


@pytest.mark.method("peso")
def test_good_options_pass_the_up_front_check_and_reach_the_model_load(no_model_load, tmp_path):
    """The check refuses only what is wrong: valid options go on to load the model (here: the patched loader)."""
    with pytest.raises(AssertionError, match="the model was loaded"):
        main([*ARGS, "--procedure", "peso", "--procedure-option", f"previous={tmp_path}", "--procedure-option", "lam=2",
              "--out", str(tmp_path / "run")])


def test_list_procedures_shows_each_option_and_the_not_private_label(capsys):
    from rankwise.cli import main

    assert main(["list", "--procedures"]) == 0
    out = capsys.readouterr().out
    assert "la-lora  (trains adapter)" in out and "previous: str | int (required)" in out
    line = next(x for x in out.splitlines() if "deterministic_noise" in x)
    assert "= False" in line and "NOT PRIVATE" in line
