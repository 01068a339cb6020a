"""Statistics stored at the configured Ks (``extract.stored_ks``) give the measures of the full
statistics (every K up to k_max), and a K that was not stored is refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from tiny_models import ARCHITECTURES, CharTokenizer

from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.jacobians.extract import ExtractConfig, extract

PROMPTS = ["hello", "abc"]  # 5 and 3 tokens: the second is NaN-padded
KS = (2, 5)
FULL = ExtractConfig(k_max=6, token_layers=(2, -1), token_prompts=2)
REDUCED = ExtractConfig(k_max=6, token_layers=(2, -1), token_prompts=2, stored_ks=KS)
METRICS = MetricConfig(ks=KS)


@pytest.fixture(scope="module")
def both() -> tuple[dict[str, xr.Dataset], dict[str, xr.Dataset]]:
    model, tokenizer = ARCHITECTURES["llama"](), CharTokenizer()
    return tuple(
        extract(model, tokenizer, PROMPTS, config, progress=False) for config in (FULL, REDUCED)
    )


def metrics(result: dict[str, xr.Dataset], config: MetricConfig = METRICS) -> xr.Dataset:
    return xr.merge(
        [
            coupling_dataset(result["depth"], config),
            token_coupling_dataset(result["tokens"], config),
        ]
    )


def test_reduced_storage_gives_the_full_measures(both) -> None:
    full, reduced = both
    assert "depth_diag" in full["depth"] and "depth_diag" not in reduced["depth"]
    assert reduced["depth"]["depth_numerator2"].sizes["k"] == len(KS)
    assert reduced["tokens"]["fixed_in_numerator2"].sizes["k"] == len(KS)
    expected, got = metrics(full), metrics(reduced)
    assert set(expected.data_vars) == set(got.data_vars)
    for name in expected.data_vars:
        a, b = xr.align(expected[name], got[name], join="exact")
        assert a.dims == b.dims, name
        # the same numpy formulas on the same numbers, only evaluated before storing: identical
        assert np.array_equal(a.values, b.values, equal_nan=True), name


def test_reduced_storage_is_smaller(both) -> None:
    full, reduced = both
    for kind in ("depth", "tokens"):
        assert reduced[kind].nbytes < 0.7 * full[kind].nbytes, kind


def test_a_k_not_stored_is_refused(both) -> None:
    _, reduced = both
    with pytest.raises(ValueError, match=r"K=3 is not among the Ks \[2, 5\].*extract.stored_ks"):
        coupling_dataset(reduced["depth"], MetricConfig(ks=(3,)))
    with pytest.raises(ValueError, match="extract.stored_ks"):
        token_coupling_dataset(reduced["tokens"], MetricConfig(ks=(2, 6)))


def test_stored_ks_are_checked() -> None:
    with pytest.raises(ValueError, match="extract.stored_ks"):
        ExtractConfig(k_max=6, stored_ks=(2, 7))
    with pytest.raises(ValueError, match="extract.stored_ks"):
        ExtractConfig(k_max=6, stored_ks=(5, 2))
