"""The guards against values a statistic would silently drop: a Jacobian whose spectrum cannot carry
K (a zero block) is named instead of printing NaN, a NaN coupling or score stops the combine
naming its file."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, save_tiny_folder

from blockcoupling import cli
from blockcoupling.coupling.metrics import MetricConfig
from blockcoupling.lm.sources import parse_source

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- spectra that cannot carry K ----------------------------------------------------------


def zeroed_tiny(folder: Path, blocks: tuple[int, ...]) -> Path:
    """A 3-block llama whose ``blocks`` (0-based) have their output projections zeroed: their
    block Jacobians are exactly 0.
    """
    import torch
    import transformers

    save_tiny_folder(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for block in blocks:
            model.model.layers[block].self_attn.o_proj.weight.zero_()
            model.model.layers[block].mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("blocks", [(1,), (0, 1)])
def test_measure_names_a_zero_block_instead_of_printing_nan(
    tmp_path: Path, blocks: tuple[int, ...], capsys: pytest.CaptureFixture
) -> None:
    folder = zeroed_tiny(tmp_path / "m", blocks)
    capsys.readouterr()
    assert cli.main(["measure", str(folder), "hello there", "--k", "4"]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip() and "it/s]" not in line]
    assert len(err) == 1 and "nan" not in captured.out
    assert f"layer {blocks[0] + 1} has rank below K=4" in err[0] and "s_1 = 0" in err[0]


def test_the_metrics_rule_names_a_zero_block_not_nan_weights(tmp_path: Path) -> None:
    import runpy
    import types

    from blockcoupling.files import io
    from blockcoupling.jacobians.extract import ExtractConfig, extract
    from blockcoupling.lm.models import load_model

    folder = zeroed_tiny(tmp_path / "m", (1,))
    model, tokenizer = load_model(parse_source({"path": str(folder)}))
    data = extract(model, tokenizer, ["hello there"], ExtractConfig(k_max=4, token_prompts=0))
    io.write_netcdf(data["depth"], tmp_path / "depth.nc")
    io.write_netcdf(data["tokens"], tmp_path / "tokens.nc")
    log = tmp_path / "metrics.log"
    sm = types.SimpleNamespace(
        log=[str(log)],
        threads=1,
        rule="metrics",
        input=types.SimpleNamespace(depth=tmp_path / "depth.nc", tokens=tmp_path / "tokens.nc"),
        output=types.SimpleNamespace(depth=tmp_path / "o.nc", tokens=tmp_path / "t.nc"),
        params=types.SimpleNamespace(
            metrics=MetricConfig(ks=(2, 4)),
            jobs=[  # as rules/common.smk's metric_jobs gives them
                {
                    "where": "model zeroed, step final",
                    "depth": str(tmp_path / "depth.nc"),
                    "tokens": str(tmp_path / "tokens.nc"),
                    "out": {"depth": str(tmp_path / "o.nc"), "tokens": str(tmp_path / "t.nc")},
                }
            ],
        ),
        wildcards=types.SimpleNamespace(model="zeroed", step="final"),
    )
    with pytest.raises(SystemExit):
        runpy.run_path(str(REPO / "scripts" / "metrics.py"), {"snakemake": sm})
    text = log.read_text()
    assert "model zeroed, step final: the Jacobian at prompt p0000, layer 2" in text
    assert "rank below K=4" in text and "NaN/Inf" not in text
    assert not (tmp_path / "o.nc").exists()


def test_require_rank_agrees_with_numpys_rank() -> None:
    import numpy as np
    import xarray as xr

    from blockcoupling.coupling.finite import require_rank

    rng = np.random.default_rng(0)
    d, k = 12, 5
    for rank in range(0, d + 1):
        jac = rng.normal(size=(d, rank)) @ rng.normal(size=(rank, d))
        s = np.linalg.svd(jac.astype(np.float32), compute_uv=False)
        values = xr.DataArray(s[None, :], dims=("layer", "rank"), coords={"layer": [1]})
        deficient = np.linalg.matrix_rank(jac) < k
        if deficient:
            with pytest.raises(ValueError, match=f"rank below K={k}"):
                require_rank(values, k, d, "m")
        else:
            require_rank(values, k, d, "m")


# --- no statistic over a silently smaller set ---------------------------------------------


def _run_combine(tmp_path: Path, name: str, datasets: dict[str, object]) -> Path:
    """scripts/combine.py on per-model files ``datasets`` (model -> dataset, step final);
    returns its log.
    """
    import runpy
    import types

    from blockcoupling.files import io

    paths = {}
    for model, dataset in datasets.items():
        paths[model] = tmp_path / model / f"{name}.nc"
        io.write_netcdf(dataset, paths[model])  # type: ignore[arg-type]
    log = tmp_path / "combine.log"
    sm = types.SimpleNamespace(
        log=[str(log)],
        threads=1,
        rule="combine_models",
        input=[str(path) for path in paths.values()],
        output=[str(tmp_path / "combined" / f"{name}.nc")],
        params=types.SimpleNamespace(
            parts=[(model, "final", str(path)) for model, path in paths.items()],
            along="init",
            meta={},
        ),
    )
    runpy.run_path(str(REPO / "scripts" / "combine.py"), {"snakemake": sm})
    return log


def _coupling(values: list[float]) -> object:
    import numpy as np
    import xarray as xr

    prompts = [f"p{i:04d}" for i in range(len(values))]
    return xr.Dataset(
        {
            "coupling": ("prompt", np.array(values)),
            "depth_mis": (("prompt", "layer"), np.zeros((len(values), 2))),
        },
        coords={"prompt": prompts, "layer": [1, 2]},
    )


def test_a_nan_coupling_of_one_prompt_stops_the_combine_naming_file_and_prompt(
    tmp_path: Path,
) -> None:
    good, bad = _coupling([-0.5, -0.4, -0.3]), _coupling([-0.5, float("nan"), -0.3])
    with pytest.raises(SystemExit):
        _run_combine(tmp_path, "coupling", {"a": good, "b": bad})
    text = (tmp_path / "combine.log").read_text()
    assert "b/coupling.nc (b, final): coupling is nan at prompt=p0001" in text
    assert "verify" in text and "NaN/Inf" not in text
    assert not (tmp_path / "combined" / "coupling.nc").exists()


def test_finite_coupling_parts_combine(tmp_path: Path) -> None:
    _run_combine(tmp_path, "coupling", {"a": _coupling([-0.5, -0.4]), "b": _coupling([-0.1, 0])})
    assert (tmp_path / "combined" / "coupling.nc").is_file()


def test_a_nan_bits_per_byte_stops_the_combine(tmp_path: Path) -> None:
    import xarray as xr

    def evaluation(bpb: float) -> xr.Dataset:
        return xr.Dataset({"bits_per_byte": ((), bpb)}, attrs={"n_items": 0})

    with pytest.raises(SystemExit):
        _run_combine(tmp_path, "evaluation", {"a": evaluation(1.2), "b": evaluation(float("nan"))})
    assert (
        "b/evaluation.nc (b, final): bits_per_byte is nan" in (tmp_path / "combine.log").read_text()
    )
