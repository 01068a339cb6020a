"""Pilot runs for the default's primary tests, on seeds disjoint from the run's (100+): train
small GPT-NeoX runs here, measure them in-process (one process, no per-job start-up) and write
one row per (run, checkpoint) to ``resources/pilot_<design>.csv``; ``--power`` then writes the
pilot power of each primary test (``blockcoupling.stats.power.decision_power``).

    python bench/pilot.py within  [--seeds 100 101 ...] [--out resources/pilot_within.csv]
    python bench/pilot.py across  [--seeds 120 ...]     [--out resources/pilot_across.csv]
    python bench/pilot.py power   [--config config.yaml] [--out resources/power.csv]

``within``: checkpoint suites (1,000 steps, 12 checkpoints), half at full data, half at a 1%
data fraction (validation loss turns up). ``across``: 300-step runs, each its own seed,
data fraction log-uniform over 1-100%, measured at the last step and (token families on) with
the random-init twin. Columns: design, run, seed, data_fraction, step, val_loss, train_loss,
excess_k{K}, overlap_k{K} (the U overlap minus its chance level K/d), eff_rank (median), and for
``across`` the token-pair excess of the trained model and its twin; elapsed_s per run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blockcoupling.runtime import isa  # noqa: E402

isa.pin()
import torch  # noqa: E402

from blockcoupling.coupling.metrics import (  # noqa: E402
    MetricConfig,
    coupling_dataset,
    token_coupling_dataset,
)
from blockcoupling.jacobians.extract import MeasureConfig, measure  # noqa: E402
from blockcoupling.lm import prompts as prompt_io  # noqa: E402
from blockcoupling.lm.models import LoadOptions, load_model, load_random_twin  # noqa: E402
from blockcoupling.lm.sources import parse_source  # noqa: E402
from blockcoupling.lm.train import TrainConfig, train  # noqa: E402
from blockcoupling.stats.core import select  # noqa: E402

KS = (2, 4, 8)
AT = dict(reading="authors", variant="ujv", norm="p")
BASE = dict(n_layers=4, d_model=64, n_heads=2, vocab_size=2048, batch_size=8)
WITHIN_STEPS = [0, 4, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1000]


def specs(design: str, seeds: list[int]) -> list[dict]:
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


def summarize(depth, tokens) -> dict:
    """The excess and overlap (minus chance) at each K, mean over prompts; median eff. rank."""
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
                values = select(tok[name], **dict(AT, k=4))
                values = values.where(values["token"] != values["token_ref"])
                out[f"tok_{part}"] = float(values.mean(skipna=True))
    return out


def design_steps(config: dict) -> list[int]:
    """The checkpoint steps of the config's emergence suites."""
    return list(config["train"]["grids"]["emergence"]["base"]["checkpoint_steps"])


def pilot_units(within: pd.DataFrame, across: pd.DataFrame, k: int, steps: list[int]) -> dict:
    """Per-unit pilot values of each primary: within-run Fisher z and last - first excess per
    suite (at the design's checkpoint steps), trained - twin token self excess per run, and the
    across-runs (excess, -val_loss) pairs.
    """
    from blockcoupling.stats.checkpoints import within_loss_z

    col = f"excess_k{k}"
    suites = within[within["step"].isin(steps)].assign(neg_val_loss=lambda f: -f["val_loss"])
    z, growth = [], []
    for _, rows in suites.groupby("run"):
        rows = rows.sort_values("step")
        z.append(within_loss_z(rows.rename(columns={col: "coupling_excess"})))
        growth.append(float(rows[col].iloc[-1] - rows[col].iloc[0]))
    return {
        "emergence_within_loss": np.array(z),
        "emergence_final_vs_init": np.array(growth),
        "tokens_self_trained_vs_random": (across["tok_self"] - across["twin_tok_self"]).to_numpy(),
        "fixed_size_excess_vs_bpb": (across[col].to_numpy(), -across["val_loss"].to_numpy()),
    }


def power_table(
    units: dict, primary: dict, design_n: dict, seed: int = 0, n_sim: int | None = None
) -> pd.DataFrame:
    """``stats.power.POWER_COLUMNS`` rows: each declared primary's power under the verdict's
    rule at the design's n and Holm's first threshold, with the n that reaches 80%.
    """
    from blockcoupling.stats import power as pw

    alpha = pw.holm_first_alpha(len(primary))
    sims = n_sim or pw.DECISION_SIM
    rows = []
    for analysis, declared in primary.items():
        effect, n = float(declared["effect"]), int(design_n[analysis])
        values = units.get(analysis)
        if values is None:
            rows.append(dict(analysis=analysis, effect=effect, n=n, alpha=alpha))
            continue
        if isinstance(values, tuple):
            x, y = values

            def at(m, x=x, y=y, effect=effect):
                return pw.slope_decision_power(x, y, effect, m, alpha, sims, seed)

            keep = np.isfinite(x) & np.isfinite(y)
            estimate = float(np.corrcoef(x[keep], y[keep])[0, 1])
            n0 = int(keep.sum())
            se = np.sqrt((1 - estimate**2) / max(n0 - 2, 1))
        else:

            def at(m, v=values, effect=effect):
                return pw.decision_power(v, effect, m, alpha, sims, seed)

            finite = values[np.isfinite(values)]
            n0, estimate = finite.size, float(finite.mean())
            se = float(finite.std(ddof=1) / np.sqrt(n0))
        power = at(n)
        need = n if power >= pw.TARGET else pw.n_for_power(at, n + 1, 4 * n)
        rows.append(
            dict(
                analysis=analysis,
                effect=effect,
                pilot_estimate=estimate,
                pilot_se=se,
                pilot_n=n0,
                pilot_df=n0 - 1,
                n=n,
                df=n - 1,
                alpha=alpha,
                power=power,
                n_for_target=need,
            )
        )
    return pd.DataFrame(rows, columns=list(pw.POWER_COLUMNS))


def write_power(args: argparse.Namespace) -> int:
    """The ``power`` command: resources/power.csv from the two pilot tables."""
    import yaml

    from blockcoupling.pipeline.grids import expand_grids

    config = yaml.safe_load(Path(args.config).read_text())
    primary = config["stats"]["primary"]
    k = int(config["stats"]["k"])
    grids = config["train"]["grids"]
    n_fixed = len(next(iter(grids["fixed_size"]["axes"].values())))
    n_suites = len(next(iter(grids["emergence"]["axes"].values())))
    expand_grids(config)  # the design must expand (paired axes of equal length)
    design_n = {
        "fixed_size_excess_vs_bpb": n_fixed,
        "tokens_self_trained_vs_random": n_fixed,
        "emergence_within_loss": n_suites,
        "emergence_final_vs_init": n_suites,
    }
    within = pd.read_csv(args.within)
    across = pd.read_csv(args.across)
    units = pilot_units(within, across, k, design_steps(config))
    table = power_table(units, primary, design_n, seed=args.seed)
    out = Path(args.out or "resources/power.csv")
    if out.is_file():  # keep config/paper.yaml's ViT rows (their own, earlier pilot)
        kept = pd.read_csv(out)
        kept = kept[kept["analysis"].str.startswith("vit_")]
        table = pd.concat([table, kept[~kept["analysis"].isin(table["analysis"])]])
    table.to_csv(out, index=False)
    print(table.to_string(index=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("design", choices=("within", "across", "power"))
    parser.add_argument("--config", default="config.yaml", help="power: the declaring config")
    parser.add_argument("--within", default="resources/pilot_within.csv")
    parser.add_argument("--across", default="resources/pilot_across.csv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--prompts", default="results/prompts/default.jsonl")
    parser.add_argument("--out", default=None)
    parser.add_argument("--work", default=None, help="training folder (default: a temp dir)")
    parser.add_argument(
        "--data-fraction", type=float, default=None, help="every run at this data fraction"
    )
    args = parser.parse_args(argv)
    if args.design == "power":
        return write_power(args)
    torch.set_num_threads(1)
    seeds = args.seeds or (
        list(range(100, 106)) if args.design == "within" else list(range(120, 136))
    )
    out = Path(args.out or f"resources/pilot_{args.design}.csv")
    items = prompt_io.read_jsonl(args.prompts)
    tokens_on = args.design == "across"
    config = MeasureConfig(
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
            data = measure(model, tok, items, config, progress=False)
            row = summarize(data["depth"], data.get("tokens") if tokens_on else None)
            if tokens_on and twin is None:
                model, tok = load_random_twin(source, 0, LoadOptions(device="cpu"))
                tw = measure(model, tok, items, config, progress=False)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
