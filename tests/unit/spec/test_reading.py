"""The reading of a model's rotation: refused with the config field named where its base is not a
positive number."""

from __future__ import annotations

import pytest

from ropelens.cli.main import main
from ropelens.errors import InputError
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_model, tiny_model_dir


@pytest.mark.parametrize("base", [0.0, -10000.0])
def test_a_base_that_is_not_positive_is_refused_naming_the_config_field(base):
    model = tiny_model("llama", rope_parameters={"rope_type": "default", "rope_theta": base})
    with pytest.raises(InputError, match=r"rope_parameters\['rope_theta'\] is " + str(base)):
        rope_spec(model)


def test_the_cli_exits_with_a_usage_error_on_a_base_of_zero(tmp_path, capsys):
    path = tiny_model_dir(
        "llama", tmp_path / "zero-base", rope_parameters={"rope_type": "default", "rope_theta": 0}
    )
    assert main(["rope-spec", str(path), "--device", "cpu"]) == 2
    assert "rope_theta'] is 0" in capsys.readouterr().err
