"""``blockcoupling pilot``: pilot runs for the default's primary tests, on seeds disjoint from
the run's (100+), and their power. ``within`` and ``across`` train small GPT-NeoX runs and
measure them in this process, one row per (run, checkpoint) in ``resources/pilot_<design>.csv``;
``power`` writes each declared primary's power from those tables
(``blockcoupling.stats.pilot_power``).

``within``: checkpoint suites (1,000 steps, 12 checkpoints), half at full data, half at a 1%
data fraction (validation loss turns up). ``across``: 300-step runs, each its own seed,
data fraction log-uniform over 1-100%, measured at the last step and (token families on) with
the random-init twin. Columns: design, run, seed, data_fraction, step, val_loss, train_loss,
excess_k{K}, overlap_k{K} (the U overlap minus its chance level K/d), eff_rank (median), and for
``across`` the token-pair excess at each K of the trained model and of its own twin (the
run's seed); elapsed_s per run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

KS = (2, 4, 8)
AT = dict(reading="authors", variant="ujv", norm="p")
BASE = dict(n_layers=4, d_model=64, n_heads=2, vocab_size=2048, batch_size=8)
WITHIN_STEPS = [0, 4, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1000]
WITHIN_SEEDS = list(range(100, 106))
ACROSS_SEEDS = list(range(120, 136))


def specs(design: str, seeds: list[int]) -> list[dict[str, Any]]:
    """The pilot runs of ``design``, one per seed."""
    if design == "within":
        half = len(seeds) // 2
        return [
            dict(
                BASE,
                seed=s,
                learning_rate=0.001,
                total_steps=1000,
                checkpoint_steps=WITHIN_STEPS,
                data_fraction=1.0 if i < half else 0.01,
            )
            for i, s in enumerate(seeds)
        ]
    n = len(seeds)
    fractions = 10 ** (-2 + 2 * (np.arange(n) + 0.5) / n)  # log-uniform, stratified
    order = np.random.default_rng(seeds[0]).permutation(n)
    return [
        dict(
            BASE,
            seed=s,
            total_steps=300,
            checkpoint_steps=[0, 300],
            data_fraction=float(np.round(fractions[order[i]], 4)),
        )
        for i, s in enumerate(seeds)
    ]


def summarize(depth: Any, tokens: Any) -> dict[str, float]:
    """The excess and overlap (minus chance) at each K, mean over prompts; median eff. rank."""
    from blockcoupling.coupling.metrics import (
        MetricConfig,
        coupling_dataset,
        token_coupling_dataset,
    )
    from blockcoupling.stats.core import select

    metrics = coupling_dataset(depth, MetricConfig(ks=KS))
    out = {"eff_rank": float(np.nanmedian(metrics["effective_rank"].values))}
    for k in KS:
        sel = dict(AT, k=k)
        out[f"excess_k{k}"] = float(select(metrics["coupling_excess"], **sel).mean())
        over = select(metrics["overlap_u"], **sel) - select(metrics["overlap_null"], **sel)
        out[f"overlap_k{k}"] = float(over.mean())
    if tokens is not None and len(tokens.data_vars):
        tok = token_coupling_dataset(tokens, MetricConfig(ks=KS))
        for part in ("self", "fixed_in", "fixed_out"):
            name = f"{part}_excess"
            if name in tok:
                for k in KS:
                    values = select(tok[name], **dict(AT, k=k))
                    values = values.where(values["token"] != values["token_ref"])
                    out[f"tok_{part}_k{k}"] = float(values.mean(skipna=True))
    return out


def design_steps(config: dict[str, Any]) -> list[int]:
    """The checkpoint steps of the config's emergence suites ([]: it trains none)."""
    grids = (config.get("train") or {}).get("grids") or {}
    if "emergence" not in grids:
        return []
    return list(grids["emergence"]["base"]["checkpoint_steps"])


def pilot_table(path: Path, columns: list[str]) -> pd.DataFrame:
    """A pilot CSV whose ``columns`` are present and finite, or a one-line ValueError naming the
    file and the column (a NaN would give a NaN power, or count fewer units, without a word).
    """
    try:
        table = pd.read_csv(path)
    except FileNotFoundError:
        raise ValueError(
            f"{path}: no such file; write it with blockcoupling pilot within|across, or name "
            "it with --within/--across"
        ) from None
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a pilot table ({error})") from None
    for column in columns:
        if column not in table:
            raise ValueError(
                f"{path}: no column {column!r}: not a pilot table; write it with "
                "blockcoupling pilot within|across"
            )
        values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if bad.any():
            raise ValueError(
                f"{path}: column {column!r} has {int(bad.sum())} of {bad.size} values not finite "
                f"numbers (row {int(np.argmax(bad)) + 1}: {table[column].iloc[int(np.argmax(bad))]}"
                "); rerun that pilot run, or drop its rows"
            )
    return table


def write_power(args: argparse.Namespace) -> str:
    """``pilot power``: the power table of the declared primaries from the two pilot tables,
    written to ``--out`` (default: the config's ``stats.power_file``); returns it as text. The
    config's ``stats.peak_step`` and ``stats.within_window`` must be the pilot's declarations
    (``declared_peak_step``, ``declared_window``), else a one-line error says what to set.
    """
    from blockcoupling.cli.config_commands import layered
    from blockcoupling.cli.parser import configfiles
    from blockcoupling.pipeline.design_units import design_units
    from blockcoupling.stats.pilot_power import power_table

    config = layered(configfiles(args))
    files = " ".join(map(str, configfiles(args)))
    stats = config.get("stats") if isinstance(config.get("stats"), dict) else {}
    primary = stats.get("primary")
    if not isinstance(primary, dict) or not primary:
        raise ValueError(f"{files}: no stats.primary tests declared; give --configfile FILE")
    try:
        k, steps = int(stats["k"]), design_steps(config)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{files}: stats.k is missing or not a number ({error!r})") from None
    if k not in KS:  # e.g. config/paper.yaml: its models are not the pilot's
        tests, said = {}, f"nothing: it measures K in {list(KS)}, not stats.k = {k}; no power"
    else:
        tests, said = _pilot_tests(args, stats, k, steps, files)
    table = power_table(tests, stats["primary"], design_units(config), seed=args.seed)
    out = Path(args.out or stats.get("power_file", "resources/power.csv"))
    table.to_csv(out, index=False)
    return f"{out} (the pilot declares {said}):\n{table.to_string(index=False)}"


def _pilot_tests(
    args: argparse.Namespace, stats: dict[str, Any], k: int, steps: list[int], files: str
) -> tuple[dict[str, Any], str]:
    """The pilot of each primary at K = ``k`` (``pilot_tests``) and what the pilot declares;
    a one-line error where the config's declarations are not the pilot's.
    """
    from blockcoupling.stats.pilot_power import declared_peak_step, declared_window, pilot_tests

    if not steps:
        raise ValueError(
            f"{files}: needs train.grids.emergence.base.checkpoint_steps; layer it over config.yaml"
        )
    col = f"excess_k{k}"
    within = pilot_table(args.within, ["step", "val_loss", col])
    declared = {
        "peak_step": declared_peak_step(within, k, steps),
        "within_window": declared_window(within, steps),
    }
    for key, value in declared.items():
        if stats.get(key) is not None and stats[key] != value:
            raise SystemExit(
                f"stats.{key} is {stats[key]} but the pilot ({args.within}) declares {value}: "
                f"set stats.{key}: {value} in the config before the run"
            )
    tests = pilot_tests(
        within,
        pilot_table(args.across, ["val_loss", col, f"tok_self_k{k}", f"twin_tok_self_k{k}"]),
        k,
        steps,
        stats.get("peak_step"),
        stats.get("within_window"),
    )
    return tests, ", ".join(f"{key} {value}" for key, value in declared.items())


def run_pilot(args: argparse.Namespace) -> str:
    """``pilot within|across``: train and measure the pilot runs, one CSV row per (run, step),
    rewritten after each run (an interrupted pilot keeps its finished runs).
    """
    seeds = args.seeds or (WITHIN_SEEDS if args.design == "within" else ACROSS_SEEDS)
    out = Path(args.out or f"resources/pilot_{args.design}.csv")
    if out.suffix != ".csv" or out.is_dir() or not out.parent.is_dir():
        raise ValueError(
            f"--out {out}: name a .csv file in an existing folder (checked before training)"
        )
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            f"--seeds {' '.join(map(str, seeds))}: a seed comes twice; give each run its own seed"
        )
    if not Path(args.prompts).is_file():
        raise ValueError(
            f"--prompts {args.prompts}: no such file; give a default run's "
            "results/prompts/default.jsonl"
        )
    from blockcoupling.runtime import blas, isa

    isa.pin()
    blas.route_if_pinned()
    import torch

    from blockcoupling.jacobians.extract import ExtractConfig, extract
    from blockcoupling.lm.models import LoadOptions, load_model, load_random_twin
    from blockcoupling.lm.sources import parse_source
    from blockcoupling.lm.text import prompts as prompt_io
    from blockcoupling.lm.training.train import TrainConfig, train

    torch.set_num_threads(1)
    items = prompt_io.read_jsonl(args.prompts)
    tokens_on = args.design == "across"
    config = ExtractConfig(
        k_max=max(KS),
        variants=("ujv",),
        max_tokens=16,
        token_layers=(2, -1) if tokens_on else (),
        token_prompts=3 if tokens_on else 0,
        token_max_tokens=12,
        spectra_prompts=0,
    )
    work = Path(args.work or tempfile.mkdtemp(prefix=f"pilot_{args.design}_"))
    rows = []
    runs = specs(args.design, seeds)
    if args.data_fraction is not None:
        runs = [dict(spec, data_fraction=args.data_fraction) for spec in runs]
    for spec in runs:
        run = f"{args.design}-s{spec['seed']}-f{spec['data_fraction']}"
        start = time.perf_counter()
        cfg = TrainConfig(**spec)
        train(cfg, work / run, threads=1)
        trained = time.perf_counter() - start
        history = pd.read_csv(work / run / "history.csv").set_index("step")
        steps = cfg.steps if args.design == "within" else [cfg.total_steps]
        twin = None
        for step in steps:
            source = parse_source({"path": str(work / run / f"step{step}")})
            model, tok = load_model(source, LoadOptions(device="cpu"))
            data = extract(model, tok, items, config, progress=False)
            row = summarize(data["depth"], data.get("tokens") if tokens_on else None)
            if tokens_on and twin is None:
                # the run's own twin (its seed), as random_init.per_run gives each run
                model, tok = load_random_twin(source, spec["seed"], LoadOptions(device="cpu"))
                tw = extract(model, tok, items, config, progress=False)
                twin = summarize(tw["depth"], tw.get("tokens"))
                row |= {f"twin_{k}": v for k, v in twin.items()}
            rows.append(
                dict(
                    design=args.design,
                    run=run,
                    seed=spec["seed"],
                    data_fraction=spec["data_fraction"],
                    step=step,
                    val_loss=float(history.loc[step, "val_loss"]),
                    train_loss=float(history.loc[step, "train_loss"]),
                    train_s=trained,
                    elapsed_s=time.perf_counter() - start,
                )
                | row
            )
        pd.DataFrame(rows).to_csv(out, index=False)
        print(
            f"{run}: train {trained:.0f} s, total {time.perf_counter() - start:.0f} s", flush=True
        )
    return f"{out}: {len(rows)} rows"
