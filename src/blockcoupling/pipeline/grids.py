"""Training grids: a grid section expanded into one training run (and its checkpoint suite)
per point of the design.
"""

from __future__ import annotations

import itertools
from typing import Any

from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.pipeline.entries import train_config
from blockcoupling.pipeline.errors import ConfigError

GRID_ABBREVIATIONS = {
    "n_layers": "L",
    "d_model": "d",
    "seed": "s",
    "total_steps": "t",
    "learning_rate": "lr",
    "weight_decay": "wd",
    "batch_size": "b",
    "data_fraction": "f",
}


def _axis_label(axis: str, value: Any) -> str:
    return f"{GRID_ABBREVIATIONS.get(axis, axis)}{value}"


def grid_runs(name: str, grid: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The training runs of ``train.grids.<name>``: every combination of the ``axes`` values over
    ``base``, named ``<name>-L2-d64-s0`` (axis abbreviations, in the axes' order); ``n_heads``
    is ``d_model / head_dim`` unless given.
    """
    runs = {}
    for point in grid_points(name, grid):
        spec = {**grid.get("base", {}), **point}
        if "n_heads" not in spec:
            d_model = spec.get("d_model", TrainConfig.d_model)
            if d_model % grid.get("head_dim", 32):
                raise ConfigError(
                    f"train.grids.{name}: d_model={d_model} is not a multiple of head_dim="
                    f"{grid.get('head_dim', 32)}; set head_dim or n_heads"
                )
            spec["n_heads"] = d_model // grid.get("head_dim", 32)
        label = "-".join(_axis_label(k, v) for k, v in point.items())
        if f"{name}-{label}" in runs:
            raise ConfigError(
                f"train.grids.{name}.axes: the point {point} comes twice (run {name}-{label}); "
                "give each run distinct axis values (e.g. seed: [0, 1], not [0, 0])"
            )
        runs[f"{name}-{label}"] = spec
    return runs


def grid_points(name: str, grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The design points of ``train.grids.<name>``: every combination of the ``axes`` values,
    or with ``paired`` the i-th value of every axis for run i (equal lengths: one data
    fraction per seed, each run an independent unit).
    """
    axes = grid["axes"]
    if grid.get("paired"):
        lengths = {axis: len(values) for axis, values in axes.items()}
        if len(set(lengths.values())) != 1:
            raise ConfigError(
                f"train.grids.{name}: paired axes need equal lengths, got "
                + ", ".join(f"{a}: {n}" for a, n in lengths.items())
            )
        return [dict(zip(axes, values)) for values in zip(*axes.values())]
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def run_group(name: str, grid: dict[str, Any], point: dict[str, Any]) -> str:
    """The ``group`` of a grid point: its run name without the ``seed`` axis (replicates share
    it).
    """
    label = "-".join(_axis_label(k, v) for k, v in point.items() if k != "seed")
    return f"{name}-{label}" if label else name


def expand_grids(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with every ``train.grids`` run under ``train.runs`` and, per run,
    its models under ``models``: ``<run>`` (its checkpoint suite, depth-wise coupling only, when
    ``checkpoints``) and
    ``<run>-final`` (its last checkpoint and random twin, in the cross-model analysis, when
    ``final``), with metadata from the run: ``family`` (the grid's ``family``, else its name),
    ``group`` (the run's name without its seed), ``data_fraction``, ``weight_decay``,
    ``learning_rate``, ``seed``.
    """
    grids = config.get("train", {}).get("grids") or {}
    if not grids:
        return config
    config = {**config, "train": dict(config["train"]), "models": dict(config.get("models") or {})}
    config["train"]["runs"] = dict(config["train"].get("runs") or {})
    for name, grid in grids.items():
        points = grid_points(name, grid)
        for point, (run, spec) in zip(points, grid_runs(name, grid).items(), strict=True):
            if run in config["train"]["runs"]:
                raise ConfigError(f"train.grids.{name}: run {run!r} is also under train.runs")
            config["train"]["runs"][run] = spec
            cfg = train_config(run, spec, f"train.grids.{name} (run {run})")
            meta = {
                "params": float(cfg.n_params()),
                "n_layers": cfg.n_layers,
                "d_model": cfg.d_model,
                "train_tokens": float(cfg.train_tokens),
                "base": True,
                "family": grid.get("family") or name,
                "pos_encoding": "RoPE",
                "group": run_group(name, grid, point),
                "data_fraction": cfg.data_fraction,
                "weight_decay": cfg.weight_decay,
                "learning_rate": cfg.learning_rate,
                "seed": cfg.seed,
            }
            wanted = grid.get("models", {"checkpoints": True, "final": True})
            for suffix, source in (
                ("", {"train": run}),
                ("-final", {"train": run, "checkpoint": "last"}),
            ):
                if not wanted.get("final" if suffix else "checkpoints", True):
                    continue
                if run + suffix in config["models"]:
                    raise ConfigError(
                        f"train.grids.{name}: model {run + suffix!r} is also under models"
                    )
                model = {"source": source, "meta": meta}
                if not suffix:  # checkpoint suites: depth-wise coupling over training only
                    model["token_families"] = False
                config["models"][run + suffix] = model
    return config
