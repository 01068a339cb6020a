"""A non-finite score or coupling is refused in one line naming the model, the step and the
measure; never written, so never silently dropped by the statistics.
"""

from __future__ import annotations

import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import xarray as xr
from tiny_models import ARCHITECTURES, CharTokenizer
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from blockcoupling.coupling.finite import require_finite, scores_defined
from blockcoupling.coupling.metrics import MetricConfig
from blockcoupling.files.io import write_netcdf
from blockcoupling.jacobians.extract import ExtractConfig, extract
from blockcoupling.lm.evaluate import evaluate
from blockcoupling.lm.training.data import train_tokenizer

TEXT = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"
ITEMS = [{"text": "Now is the", "choices": [" winter", " summer"], "answer": 0}]


def _neox(vocab: int) -> GPTNeoXForCausalLM:
    torch.manual_seed(0)
    config = GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    return GPTNeoXForCausalLM(config).eval()


def test_a_nan_in_the_output_head_is_refused_naming_model_step_and_score() -> None:
    tokenizer = train_tokenizer([TEXT], vocab_size=258)
    model = _neox(len(tokenizer))
    clean = evaluate(model, tokenizer, [TEXT], ITEMS, progress=False)
    require_finite(clean, scores_defined(clean), "model m, step 0")  # finite: passes
    with torch.no_grad():
        model.get_output_embeddings().weight[5, 3] = math.nan
    result = evaluate(model, tokenizer, [TEXT], ITEMS, progress=False)
    assert math.isnan(float(result["bits_per_byte"]))
    assert math.isnan(float(result["mc_accuracy"]))  # not argmax's pick of the first NaN
    with pytest.raises(ValueError) as error:
        require_finite(result, scores_defined(result), "model tiny-nan, step 64")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("model tiny-nan, step 64: bits_per_byte is nan (1 of 1 values")
    assert scores_defined(evaluate(model, tokenizer, [TEXT], [], progress=False)) == [
        "bits_per_byte"
    ]  # no items: the accuracies are NaN by definition, not refused


def test_the_first_non_finite_value_is_located() -> None:
    values = np.zeros((2, 3))
    values[1, 2] = np.inf
    data = xr.Dataset(
        {"coupling": (("k", "prompt"), values)}, coords={"k": [2, 10], "prompt": [0, 1, 2]}
    )
    with pytest.raises(ValueError, match=r"^w: coupling is inf at k=10, prompt=2 \(1 of 6 "):
        require_finite(data, ["coupling"], "w")


class _Outputs(list):
    """Snakemake's output list: every path, and the named ones as attributes."""


def _metrics_job(tmp_path: Path, depth: xr.Dataset, tokens: xr.Dataset) -> SimpleNamespace:
    write_netcdf(depth, tmp_path / "depth.nc")
    write_netcdf(tokens, tmp_path / "tokens.nc")
    output = _Outputs([str(tmp_path / "c.nc"), str(tmp_path / "t.nc")])
    output.depth, output.tokens = output
    return SimpleNamespace(
        input=SimpleNamespace(depth=str(tmp_path / "depth.nc"), tokens=str(tmp_path / "tokens.nc")),
        output=output,
        params=SimpleNamespace(
            metrics=MetricConfig(ks=(2,)),
            jobs=[  # as rules/common.smk's metric_jobs gives them
                {
                    "where": "model tiny-llama, step final",
                    "depth": str(tmp_path / "depth.nc"),
                    "tokens": str(tmp_path / "tokens.nc"),
                    "out": {"depth": output.depth, "tokens": output.tokens},
                }
            ],
        ),
        wildcards=SimpleNamespace(model="tiny-llama", step="final"),
        log=[],
        rule="metrics",
        threads=1,
    )


def test_the_metrics_job_refuses_a_nan_coupling(tmp_path: Path, capsys) -> None:
    config = ExtractConfig(k_max=4, token_layers=(), token_prompts=0)
    out = extract(
        ARCHITECTURES["llama"](), CharTokenizer(), ["hello", "abc"], config, progress=False
    )
    script = str(Path(__file__).parents[1] / "scripts" / "metrics.py")
    sm = _metrics_job(tmp_path, out["depth"], out["tokens"])
    runpy.run_path(script, init_globals={"snakemake": sm})
    assert Path(sm.output.depth).is_file()  # finite: written

    bad = out["depth"].copy(deep=True)
    bad["depth_diag"][{"prompt": 1}] = np.nan
    sm = _metrics_job(tmp_path / "bad", bad, out["tokens"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        runpy.run_path(script, init_globals={"snakemake": sm})
    (line,) = capsys.readouterr().err.splitlines()  # one line, the job's log holds the rest
    # the input statistic is named before any measure is computed from it
    assert " ERROR metrics: model tiny-llama, step final: " in line
    assert "depth_diag is nan at " in line
    assert "prompt=p0001" in line and not Path(sm.output.depth).exists()
