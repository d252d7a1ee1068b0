import math

import pytest

from hpinteract.protocol.errors import InvalidHParam
from hpinteract.protocol.hparams import BUILTINS, HParam, build_specs, validate_changes


def specs():
    return build_specs({"lr": 0.1, "batch_size": 64, "name": "x", "flag": True},
                       {"dropout": HParam(0.1, low=0.0, high=0.9),
                        "opt": HParam("sgd", choices=("sgd", "adam"))})


def test_values_are_coerced_to_the_declared_kind():
    got = validate_changes(specs(), {"lr": 1, "batch_size": 32.0, "flag": False})
    assert got == {"lr": 1.0, "batch_size": 32, "flag": False}
    assert isinstance(got["lr"], float) and isinstance(got["batch_size"], int)


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"lrr": 1.0}, "lrr", "did you mean 'lr'"),
    ({"lr": "0.1"}, "lr", "must be float"),
    ({"lr": True}, "lr", "must be float"),
    ({"lr": math.nan}, "lr", "not a finite"),
    ({"lr": -math.inf}, "lr", "not a finite"),
    ({"lr": -1}, "lr", "below the minimum"),
    ({"batch_size": 1.5}, "batch_size", "must be int"),
    ({"dropout": 1.0}, "dropout", "above the maximum"),
    ({"opt": "rmsprop"}, "opt", "allowed values"),
    ({"flag": 1}, "flag", "must be bool"),
    ({"name": 3}, "name", "must be str"),
])
def test_each_kind_of_bad_value_names_the_field_and_reason(changes, field, words):
    with pytest.raises(InvalidHParam) as exc:
        validate_changes(specs(), changes)
    assert exc.value.field == field and words in str(exc.value)


def test_builtins_keep_their_bounds_when_given_a_default():
    s = build_specs({"momentum": 0.9})
    assert s["momentum"].high == BUILTINS["momentum"].high
    with pytest.raises(InvalidHParam, match=r"momentum=1\.5 is above the maximum 1\.0"):
        build_specs({"momentum": 1.5})


def test_spec_round_trips_through_the_wire():
    spec = HParam(0.1, low=0.0, high=0.9, log=False, doc="drop")
    assert HParam.from_wire(spec.to_wire()) == spec


def test_bad_specs_are_reported():
    with pytest.raises(InvalidHParam, match=r"low \(2\) is above high \(1\)"):
        HParam(1, low=2, high=1)
    with pytest.raises(InvalidHParam, match="unsupported hyper-parameter type list"):
        HParam([1, 2])


def test_a_fixed_value_refuses_every_change_with_its_reason_and_travels():
    spec = HParam(16, fixed="the loader is built once")
    assert spec.validate("batch_size", 16) == 16  # the value it has is no change
    with pytest.raises(InvalidHParam, match="batch_size cannot change in this job: the loader"):
        spec.validate("batch_size", 32)
    assert HParam.from_wire(spec.to_wire()) == spec
