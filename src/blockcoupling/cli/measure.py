"""``measure``: the quick command, one model's coupling on a few prompts beside its chance
level, the excess, the overlap beside K/d and the effective rank.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

SEED_MAX = 2**63 - 1  # torch's seeds and NetCDF's int64


def _check_measure_flags(args: argparse.Namespace) -> None:
    """The flags of ``measure`` that need no model, checked before it loads (errors name them)."""
    if args.k < 1:
        raise ValueError(f"--k {args.k}: K must be >= 1")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ValueError(f"--max-tokens {args.max_tokens}: keep at least 2 tokens")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.threads is not None and not 1 <= args.threads <= (cpus or 1):
        raise ValueError(f"--threads {args.threads}: give 1 to {cpus or 1} (the CPUs this may use)")
    if not 0 <= args.seed <= SEED_MAX:
        raise ValueError(f"--seed {args.seed}: give a seed from 0 to 2**63-1")
    if args.out is not None and args.out.is_dir():
        raise ValueError(
            f"--out {args.out} is a folder: name a .nc file in it, e.g. {args.out}/m.nc"
        )
    if args.out is not None and (args.out.suffix != ".nc" or not args.out.parent.is_dir()):
        raise ValueError(f"--out {args.out}: name a .nc file in an existing folder, e.g. m.nc")
    for i, prompt in enumerate(args.prompts, 1):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as error:
            byte = prompt[error.start].encode("utf-8", "surrogateescape")
            raise ValueError(
                f"PROMPT {i} is not UTF-8 text (byte {byte!r} at character {error.start}): "
                "give prompts as UTF-8"
            ) from None


READ_ME = (
    "how to read: coupling = minus the mean m_K over block pairs l != l' (the paper's); chance = "
    "its value for unrelated bases; excess = coupling - chance (0: chance, > 0: more coupled); "
    "overlap of top-K subspaces is K/d at chance; K above the eff. rank compares noise directions"
)
COLUMNS = {  # prompt_table column -> its heading in the table
    "coupling": "coupling",
    "coupling_null": "chance",
    "coupling_excess": "excess",
    "overlap_u": "overlap",
    "overlap_null": "K/d",
    "effective_rank": "eff.rank",
}


def measured(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Load the model (or its twin) and measure the prompts: ``(coupling dataset, header
    fields)``; the coupling dataset (``coupling_dataset``, with coordinate ``n_tokens``) is what
    ``--out`` writes.
    """
    _check_measure_flags(args)
    from blockcoupling.runtime import isa

    isa.pin()  # the workflow jobs' code path (AVX2), set before torch loads
    import torch

    from blockcoupling.runtime import blas

    blas.route_if_pinned()  # and their matmuls

    from blockcoupling import api
    from blockcoupling.coupling.finite import require_rank
    from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset
    from blockcoupling.files.io import provenance
    from blockcoupling.jacobians.extract import ExtractConfig, extract
    from blockcoupling.runtime.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    source = api.as_source(args.source)
    try:
        resolve_device(args.device)
    except ValueError as error:
        raise ValueError(f"--{error}; give --device cpu or auto") from None  # "--device 'x'..."
    if args.random_twin:
        model, tokenizer = api.load_random_twin(source, args.seed, args.dtype, args.device)
    else:
        model, tokenizer = api.load_model(source, args.dtype, args.device)
    width = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(width, int) and args.k > width:
        raise ValueError(f"--k {args.k} exceeds the model's hidden size {width}; give --k {width}")
    config = ExtractConfig(
        k_max=args.k,
        max_tokens=args.max_tokens,
        variants=(args.variant,),
        allow_full_sequence=args.allow_full_sequence,
    )
    attrs = provenance(model=source.describe(), random_twin=args.random_twin, seed=args.seed)
    depth = extract(model, tokenizer, args.prompts, config, attrs=attrs)["depth"]
    width = int(depth.attrs.get("hidden_size", width or depth.sizes["rank"]))
    require_rank(depth["singular_values"], args.k, width, source.describe())
    metrics = coupling_dataset(depth, MetricConfig(ks=(args.k,), readings=(args.reading,)))
    twin = f" (random twin, seed {args.seed})" if args.random_twin else ""
    header = {
        "model": source.describe() + twin,
        "blocks": depth.sizes["layer"],
        "d_model": width,
        "k": args.k,
        "reading": args.reading,
        "variant": args.variant,
        "norm": "p",
        "p": 2.0,
    }
    return metrics, header


def measure_summary(args: argparse.Namespace) -> str:
    """Measure the prompts; return the table (or, with ``--json``, the JSON summary), after
    writing the coupling dataset to ``--out`` when given.
    """
    import numpy as np

    from blockcoupling.files.io import write_netcdf
    from blockcoupling.stats.calibration import prompt_table
    from blockcoupling.stats.selection import Selection

    metrics, header = measured(args)
    if args.out is not None:
        write_netcdf(metrics, args.out)
    table = prompt_table(metrics, Selection(args.k, args.reading, args.variant, "p"))
    tokens = dict(zip(table.index, [int(n) for n in metrics["n_tokens"].values]))
    texts = dict(zip(table.index, args.prompts))
    if args.json:

        def row(name: str) -> dict[str, Any]:
            values = {c: float(v) for c, v in table.loc[name].items()}
            return {c: v if np.isfinite(v) else None for c, v in values.items()}

        prompts = [
            {"prompt": p, "text": texts[p], "tokens": tokens[p], **row(p)} for p in table.index[:-1]
        ]
        return json.dumps({**header, "prompts": prompts, "mean": row("mean")}, indent=2)
    lines = [
        f"{header['model']}: {header['blocks']} blocks, d={header['d_model']}; m_{args.k} "
        f"{args.reading}/{args.variant}, p=2",
        f"{'prompt':<10} {'tokens':>6} " + " ".join(f"{h:>9}" for h in COLUMNS.values()),
    ]
    for name, values in table.iterrows():
        cells = [
            f"{values[c]:>+9.4f}" if c == "coupling_excess" else f"{values[c]:>9.4f}"
            for c in COLUMNS
            if c != "effective_rank"
        ]
        lines.append(
            f"{name:<10} {tokens.get(name, ''):>6} "
            + " ".join(cells)
            + f" {values['effective_rank']:>9.1f}"
        )
    lines.append(READ_ME)
    if table.loc["mean", "effective_rank"] < args.k:
        lines.append(
            f"warning: --k {args.k} is above the median effective rank "
            f"{table.loc['mean', 'effective_rank']:.1f}: the excess partly measures the spectrum's "
            "shape (docs/science.md, 'Which K'); give a smaller --k"
        )
    if args.out is not None:
        lines.append(f"wrote {args.out}")
    return "\n".join(lines)
