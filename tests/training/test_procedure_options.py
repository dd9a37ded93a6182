"""Procedure options are the fields of each procedure's config dataclass, parsed by the one KEY=VALUE parser
(`core.options`): every registered procedure's config resolves and builds from its defaults, and the up-front check
refuses what it should (names, types, allowed values, required fields, the config's own `validate`)."""

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

from rankwise.core.options import config_from_options, config_or_options, option, parse_key_values
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.recipes.car_lora.procedure import DEFAULT_OPERATORS
from rankwise.recipes.coa_lora.procedure import DEFAULTS as COA_DEFAULTS
from rankwise.registry import resolve
from rankwise.registry.tables import procedure_entries
from rankwise.training.procedures import build_procedure, check_procedure_options, check_trains


def test_every_procedure_names_a_builder_and_a_frozen_config_dataclass():
    assert set(procedure_entries()) == {"car-lora", "coa-lora", "dfa", "la-lora", "lmao", "peso", "trady", "wasi"}
    for name, entry in procedure_entries().items():
        cls = resolve(entry.config)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
        assert callable(resolve(entry.builder)), name


def test_the_builders_defaults_pass_their_own_declaration():
    check_procedure_options("coa-lora", COA_DEFAULTS)
    check_procedure_options("la-lora", {"arm": "la-lora", "clients": 4, "rounds": 10, "epsilon": 8.0, "beta": 0.5})
    check_procedure_options("lmao", {"base_lr": 1e-6, "eps": 1e-3, "weight_decay": 0, "params": "all", "top_k_layers": None,
                                     "perturbation": "exact"})
    check_procedure_options("car-lora", {"operators": DEFAULT_OPERATORS, "layers": (27, 28), "skip_layers": 28})


def test_peso_needs_an_existing_previous_folder(tmp_path):
    check_procedure_options("peso", {"previous": str(tmp_path), "lam": 2, "proximal": "l2", "eps": 0.0})
    with pytest.raises(InvalidInputError, match="needs --procedure-option previous="):
        check_procedure_options("peso", {"lam": 2})
    with pytest.raises(InvalidInputError, match="not a folder"):
        check_procedure_options("peso", {"previous": str(tmp_path / "missing")})


@dataclass(frozen=True)
class _Config:
    n: int = 1
    x: float = 0.0
    flag: bool | None = None
    mode: str = field(default="a", metadata=option(choices=("a", "b")))
    kind: Literal["p", "q"] = "p"
    pair: tuple[int, ...] = (1, 2)


def test_types_choices_and_bools():
    config_from_options(_Config, {"n": 3, "x": 2, "flag": None, "mode": "b"}, "p")
    assert config_from_options(_Config, {"x": 2}, "p").x == 2.0 and type(config_from_options(_Config, {"x": 2}, "p").x) is float
    config_from_options(_Config, {"x": 0.5, "flag": False, "pair": [3, 4]}, "p")
    for given, match in [({"n": True}, "n must be int, got True"),  # a bool is not an int here
                         ({"n": 2.0}, "n must be int, got 2.0"), ({"x": "fast"}, "x must be int or float"),
                         ({"flag": 1}, "flag must be bool or None"), ({"mode": "c"}, r"mode must be one of \['a', 'b'\]"),
                         ({"kind": "r"}, r"kind must be one of \['p', 'q'\]"), ({"pair": 3}, "pair must be list or tuple"),
                         ({"m": 1}, r"has no option\(s\) \['m'\]; its options are \['n', 'x', 'flag', 'mode', 'kind', 'pair'\]")]:
        with pytest.raises(InvalidInputError, match=match):
            config_from_options(_Config, given, "p")


def test_the_configs_own_validate_runs_after_the_per_option_checks():
    seen = []

    @dataclass(frozen=True)
    class Checked:
        lo: float = 0.0

        def validate(self):
            seen.append(self.lo)

    with pytest.raises(InvalidInputError):
        config_from_options(Checked, {"lo": "x"}, "p")
    assert seen == []
    config_from_options(Checked, {"lo": 1}, "p")
    assert seen == [1.0]


def test_a_config_or_keyword_options_not_both():
    assert config_or_options(_Config, None, {"n": 2}, "p") == _Config(n=2)
    assert config_or_options(_Config, _Config(n=3), {}, "p") == _Config(n=3)
    with pytest.raises(InvalidInputError, match="not both"):
        config_or_options(_Config, _Config(), {"n": 2}, "p")
    with pytest.raises(InvalidInputError, match="n must be int"):
        config_or_options(_Config, _Config(n="two"), {}, "p")  # a config built in Python is checked too


def test_key_values_are_literals_or_strings():
    assert parse_key_values(["a=1e-4", "b=(1, 2)", "c=pissa", "d=None", "e=a=b"]) == {
        "a": 1e-4, "b": (1, 2), "c": "pissa", "d": None, "e": "a=b"}
    # booleans as a shell user types them, beside Python's spelling
    assert parse_key_values(["x=false", "y=TRUE", "z=True", "w=falsey"]) == {"x": False, "y": True, "z": True, "w": "falsey"}
    with pytest.raises(InvalidInputError, match="KEY=VALUE"):
        parse_key_values(["novalue"], "--procedure-option")
    for overflowing in ("lora_alpha=1e999", "budgets=(1, 2, -1e400)", "x=nan"):  # literal_eval reads 1e999 as inf
        if overflowing == "x=nan":
            assert parse_key_values([overflowing]) == {"x": "nan"}  # the word nan is a string, refused by the config
            continue
        with pytest.raises(InvalidInputError, match="not finite"):
            parse_key_values([overflowing], "--option")


def test_build_procedure_checks_the_options_before_calling_the_builder():
    with pytest.raises(InvalidInputError, match="zo_lr"):
        build_procedure("lmao", None, None, 0, zo_lr=1.0)  # no module: the builder would fail otherwise
    with pytest.raises(UnknownNameError, match="known"):
        check_procedure_options("no-such-procedure", {})


def test_what_a_procedure_trains_decides_the_method_it_needs():
    check_trains("lmao", full=False)
    with pytest.raises(InvalidInputError, match="needs an adapter --method, not full"):
        check_trains("lmao", full=True)


def test_a_procedure_refuses_an_adapter_its_record_does_not_list():
    check_trains("la-lora", full=False, method="lora")
    check_trains("coa-lora", full=False, method="coa-lora")
    check_trains("coa-lora", full=False, method="lora")
    check_trains("peso", full=False, method="pica")  # peso's record lists none: any adapter
    with pytest.raises(InvalidInputError, match="--procedure la-lora trains lora adapters, not --method pica"):
        check_trains("la-lora", full=False, method="pica")
    with pytest.raises(InvalidInputError, match="coa-lora or lora adapters, not --method guardspace"):
        check_trains("coa-lora", full=False, method="guardspace")
