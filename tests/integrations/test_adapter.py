"""The callbacks' shared part (integrations/adapter.py), below the frameworks."""

import pytest
import torch

from hpinteract.integrations.adapter import FrameworkJob, check_settings
from hpinteract.protocol.errors import ConfigError


def test_unknown_settings_are_named():
    with pytest.raises(ConfigError, match=r"unknown settings \['sync_evry'\]"):
        check_settings("lightning", {"sync_evry": 5})
    assert check_settings("lightning", {"sync_every": 5}) == {"sync_every": 5}


def test_logged_values_keep_numbers_and_rename_hpinteracts_own_names(caplog):
    job = FrameworkJob("transformers", None, None, {})
    out = job.metrics({"grad_norm": 1.5, "acc": torch.tensor(0.5), "note": "x",
                       "hist": torch.zeros(3), "none": None}, "hf")
    assert set(out) == {"hf_grad_norm", "acc"}
    assert "recorded as 'hf_grad_norm'" in caplog.text
