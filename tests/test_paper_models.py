"""The paper's model table (seeds/paper.txt, Appendix A.1) as resources/paper_models.tsv."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

TSV = Path(__file__).resolve().parents[1] / "resources" / "paper_models.tsv"


@pytest.fixture(scope="module")
def models():
    return pd.read_csv(TSV, sep="\t").set_index("name", drop=False)


def test_shape_and_columns(models):
    # The A.1 table has 42 rows; the text says "38 total LLMs (24 base LLMs and 14 fine-tuned)":
    # the table adds Pythia 12B, 2.8B, 1.4B, 1B beyond the base list in the text.
    assert len(models) == 42
    assert list(models.columns) == [
        "name", "hub_id", "family", "params", "n_layers", "d_model", "train_tokens",
        "score", "pos_encoding", "base", "gpu_mem_gb", "dtype", "quantization", "device_map",
    ]  # fmt: skip
    assert (~models["base"]).sum() == 14
    assert models["name"].is_unique and models["hub_id"].is_unique
    assert models["name"].str.fullmatch(r"[a-z0-9][a-z0-9.-]*").all()
    assert models["hub_id"].str.fullmatch(r"[\w.-]+/[\w.-]+").all()


def test_value_ranges(models):
    scores = models["score"].dropna()
    assert ((scores > 0) & (scores < 100)).all()
    assert models["score"].isna().sum() == 6  # blank cells in the table, never 0
    for col in ("n_layers", "d_model", "gpu_mem_gb"):
        assert models[col].dtype == np.int64 and (models[col] > 0).all()
    assert (models["params"] >= 1e8).all() and (models["train_tokens"].dropna() >= 1e10).all()
    assert set(models["pos_encoding"]) == {"RoPE", "ALiBi", "Sine"}
    # The declared GPU memory holds at least the weights in their storage format (the planner,
    # blockcoupling.pipeline.cost, checks the whole job: tests/test_plan.py runs it on the
    # paper config)
    per_param = (
        models["quantization"]
        .map({"4bit": 0.5, "8bit": 1.0})
        .fillna(models["dtype"].map({"float32": 4.0, "bfloat16": 2.0}))
    )
    assert per_param.notna().all()
    assert (models["gpu_mem_gb"] * 1e9 >= per_param * models["params"]).all()
    assert set(models["quantization"].dropna()) <= {"4bit", "8bit"}


@pytest.mark.parametrize(
    "name, params, n_layers, d_model, train_tokens, score, pos",
    [  # read off the paper's table
        ("llama-2-70b", 70e9, 80, 8192, 2e12, 66.05, "RoPE"),
        ("falcon-7b", 7e9, 32, 4544, 1.5e12, 44.17, "RoPE"),
        ("gpt2", 117e6, 12, 768, np.nan, 28.53, "Sine"),
        ("llama-3-70b", 70e9, 80, 8192, 15e12, np.nan, "RoPE"),
    ],
)
def test_rows_match_paper(models, name, params, n_layers, d_model, train_tokens, score, pos):
    row = models.loc[name]
    assert (row["params"], row["n_layers"], row["d_model"], row["pos_encoding"]) == (
        params,
        n_layers,
        d_model,
        pos,
    )
    np.testing.assert_equal([row["train_tokens"], row["score"]], [train_tokens, score])
