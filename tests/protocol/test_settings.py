"""The job's environment settings (hpinteract/protocol/settings.py): defaults, accepted
spellings, and an error that names the variable and what it takes."""

from __future__ import annotations

import pytest

from hpinteract.protocol import settings
from hpinteract.protocol.errors import ConfigError


def test_defaults_when_unset_or_empty():
    assert settings.coordinator_mode({}) == "thread"
    assert settings.coordinator_mode({"HPINTERACT_COORDINATOR": " "}) == "thread"
    assert settings.coordinator_nice({}) == settings.DEFAULT_NICE == 10
    assert settings.coordinator_nice({"HPINTERACT_COORDINATOR_NICE": ""}) == 10
    settings.check({})


def test_accepted_values():
    assert settings.coordinator_mode({"HPINTERACT_COORDINATOR": "PROCESS"}) == "process"
    assert settings.coordinator_mode({"HPINTERACT_COORDINATOR": "thread"}) == "thread"
    for n in (0, 5, 19):
        assert settings.coordinator_nice({"HPINTERACT_COORDINATOR_NICE": f" {n} "}) == n


@pytest.mark.parametrize(("env", "message"), [
    ({"HPINTERACT_COORDINATOR": "threads"},
     "HPINTERACT_COORDINATOR='threads': expected one of thread, process"),
    ({"HPINTERACT_COORDINATOR_NICE": "ten"},
     "HPINTERACT_COORDINATOR_NICE='ten': expected a whole number from 0 to 19"),
    ({"HPINTERACT_COORDINATOR_NICE": "20"}, "HPINTERACT_COORDINATOR_NICE='20'"),
    ({"HPINTERACT_COORDINATOR_NICE": "-1"}, "HPINTERACT_COORDINATOR_NICE='-1'"),
    ({"HPINTERACT_COORDINATOR_NICE": "2.5"}, "HPINTERACT_COORDINATOR_NICE='2.5'"),
])
def test_a_wrong_value_is_a_config_error_naming_it(env, message):
    with pytest.raises(ConfigError) as err:
        settings.check(env)
    assert message in str(err.value)
