"""Declared procedure options (`training.procedure_options`, the table in `training.procedure_table`): every
registered procedure declares exactly the options its builder takes, and the up-front check refuses what it should."""

import pytest

from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.training import car_lora, coa_lora, la_lora_procedure, lmao, peso
from rankwise.training.procedure_options import NUMBER, ProcedureOption, ProcedureOptions, check_options
from rankwise.training.procedure_table import PROCEDURE_OPTIONS, build_procedure, check_procedure_options
from rankwise.training.procedures import PROCEDURES


def test_every_procedure_declares_exactly_its_builders_options():
    builders = {"lmao": lmao.OPTIONS, "peso": peso.OPTIONS, "car-lora": car_lora.OPTIONS, "coa-lora": coa_lora.DEFAULTS,
                "la-lora": la_lora_procedure.OPTIONS}
    assert set(PROCEDURE_OPTIONS) == set(PROCEDURES) == set(builders)
    for name, taken in builders.items():
        assert set(PROCEDURE_OPTIONS[name].options) == set(taken), name


def test_the_builders_defaults_pass_their_own_declaration():
    check_procedure_options("coa-lora", coa_lora.DEFAULTS)
    check_procedure_options("la-lora", {k: v for k, (_, v) in la_lora_procedure.OPTIONS.items() if k != "noise_multiplier"})
    check_procedure_options("lmao", {"base_lr": 1e-6, "eps": 1e-3, "weight_decay": 0, "params": "all", "top_k_layers": None,
                                     "perturbation": "exact"})
    check_procedure_options("car-lora", {"operators": car_lora.DEFAULT_OPERATORS, "layers": (27, 28), "skip_layers": 28})


def test_peso_needs_an_existing_previous_folder(tmp_path):
    check_procedure_options("peso", {"previous": str(tmp_path), "lam": 2, "proximal": "l2", "eps": 0.0})
    with pytest.raises(InvalidInputError, match="needs --procedure-option previous="):
        check_procedure_options("peso", {"lam": 2})
    with pytest.raises(InvalidInputError, match="not a folder"):
        check_procedure_options("peso", {"previous": str(tmp_path / "missing")})


def test_types_choices_and_bools():
    declared = ProcedureOptions({"n": ProcedureOption((int,)), "x": ProcedureOption(NUMBER),
                                 "flag": ProcedureOption((bool, type(None))), "mode": ProcedureOption((str,), choices=("a", "b"))})
    check_options("p", declared, {"n": 3, "x": 2, "flag": None, "mode": "b"})
    check_options("p", declared, {"x": 0.5, "flag": False})
    for given, match in [({"n": True}, "n must be int, got True"),  # a bool is not an int here
                         ({"n": 2.0}, "n must be int, got 2.0"), ({"x": "fast"}, "x must be int or float"),
                         ({"flag": 1}, "flag must be bool or None"), ({"mode": "c"}, r"mode must be one of \['a', 'b'\]"),
                         ({"m": 1}, r"has no option\(s\) \['m'\]; its options are \['n', 'x', 'flag', 'mode'\]")]:
        with pytest.raises(InvalidInputError, match=match):
            check_options("p", declared, given)


def test_the_procedure_wide_check_runs_after_the_per_option_ones():
    seen = []
    declared = ProcedureOptions({"lo": ProcedureOption(NUMBER)}, check=lambda o: seen.append(dict(o)))
    with pytest.raises(InvalidInputError):
        check_options("p", declared, {"lo": "x"})
    assert seen == []
    check_options("p", declared, {"lo": 1})
    assert seen == [{"lo": 1}]


def test_build_procedure_checks_the_options_before_calling_the_builder():
    with pytest.raises(InvalidInputError, match="zo_lr"):
        build_procedure("lmao", None, None, 0, zo_lr=1.0)  # no module: the builder would fail otherwise
    with pytest.raises(UnknownNameError, match="known"):
        check_procedure_options("no-such-procedure", {})
