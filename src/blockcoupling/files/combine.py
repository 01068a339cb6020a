"""Concatenate per-model, per-step datasets into one (dims ``model`` x ``init`` or ``step``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from blockcoupling.coupling.arguments import expect, expect_dataset

# Model metadata that become coords along ``model``, and the init label of each step wildcard.
META_FIELDS = (
    "params",
    "n_layers",
    "d_model",
    "train_tokens",
    "score",
    "base",
    "family",
    "pos_encoding",
    "group",  # models that differ only by seed share a group (train.grids)
    "data_fraction",  # the training recipe of models trained here (train.grids)
    "weight_decay",
    "learning_rate",
    "seed",
)
TRAINED_INITS = {"final": "trained", "random": "random"}

# The combined files keep every variable of their per-model files (the metrics hold exactly the
# registered measures, blockcoupling.coupling.registry): nothing is dropped on the way.
NAMES = ("coupling", "tokens", "trajectories", "spectra", "evaluation")
PER_MODEL_COORDS = ("n_tokens", "token_position")
KEEP_ATTRS = (
    "k_max",
    "ks",
    "p",
    "blockcoupling_version",
    "torch_version",
    "transformers_version",
    "config",
    "extract_config",
    "null_draws",
    "null_seed",
    "null_pool",
    "null_picks",
)


def _label(step: str, along: str) -> str | int:
    return TRAINED_INITS[step] if along == "init" else int(step)


def _meta_coord(values: list[Any]) -> np.ndarray:
    if all(isinstance(v, bool) or v is None for v in values):
        return np.array([bool(v) for v in values])
    if all(isinstance(v, (int, float)) or v is None for v in values):
        return np.array([np.nan if v is None else float(v) for v in values])
    return np.array(["" if v is None else str(v) for v in values])


def _check_parts(parts: Any, name: Any, along: Any, meta: Any) -> None:
    """``combine``'s arguments, each refused in one line naming what was expected: the kind of
    every dataset (``coupling`` parts are coupling datasets, never an extraction's depth one),
    the step labels ``along`` takes, the metadata mapping.
    """
    expect(name, str, "combine(name=...)")
    if name not in NAMES:
        raise ValueError(f"unknown combined dataset {name!r}; one of {', '.join(NAMES)}")
    if along not in ("init", "step"):
        raise ValueError(f"combine(along=...): expected 'init' or 'step', got {along!r}")
    expect(parts, dict, "combine(parts=...)")
    expect(meta, dict, "combine(meta=...)")
    if not parts:
        raise ValueError("nothing to combine")
    kinds = (name, "empty") if name in ("tokens", "spectra") else (name,)
    for key, dataset in parts.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            raise TypeError(f"combine(parts=...): expected (model, step) keys of str, got {key!r}")
        model, step = key
        steps_ok = step in TRAINED_INITS if along == "init" else step.isdigit()
        if not steps_ok:
            expected = "final or random" if along == "init" else "a checkpoint number, e.g. '64'"
            raise ValueError(
                f"combine(parts=...): step {step!r} of {model!r} along {along!r}: expected "
                f"{expected}"
            )
        expect_dataset(dataset, kinds, f"combine(parts[{key!r}])")


def combine(
    parts: dict[tuple[str, str], xr.Dataset], name: str, along: str, meta: dict[str, dict[str, Any]]
) -> xr.Dataset:
    """One dataset of several models' and steps' datasets, as the workflow's combine rule
    writes ``results/combined/``.

    Outer join: NaN where a model has fewer layers or a prompt fewer tokens.

    Parameters
    ----------
    parts : dict of (str, str) to xarray.Dataset
        ``(model, step) -> dataset``; step ``final``/``random`` along ``init``, checkpoint ints
        along ``step``.
    name : str
        Which dataset the parts are, one of ``NAMES`` (``coupling``, ``tokens``,
        ``trajectories``, ``spectra``, ``evaluation``).
    along : str
        ``init`` (steps final/random) or ``step`` (checkpoint ints).
    meta : dict of str to dict
        Each model's metadata (``d_model``, ``n_layers``, ``family``, ...: docs/datasets.md),
        made coords along ``model``.

    Returns
    -------
    xarray.Dataset
        The parts with dims ``model`` and ``along`` in front.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> parts = {("m", "final"): trained, ("m", "random"): twin}  # doctest: +SKIP
    >>> bc.combine(parts, "coupling", "init", {"m": {"d_model": 576}})  # doctest: +SKIP
    """
    _check_parts(parts, name, along, meta)
    per_model: dict[str, list[xr.Dataset]] = {}
    for (model, step), dataset in parts.items():
        dataset = dataset.reset_coords([c for c in PER_MODEL_COORDS if c in dataset.coords])
        dataset = dataset.expand_dims({along: [_label(step, along)]})
        per_model.setdefault(model, []).append(dataset)
    models = sorted(per_model)
    stacked = [
        xr.concat(
            per_model[m], dim=along, join="outer", combine_attrs="drop_conflicts"
        ).expand_dims(model=[m])
        for m in models
    ]
    combined = xr.concat(stacked, dim="model", join="outer", combine_attrs="drop_conflicts")
    if along == "step":
        combined = combined.sortby("step")
    for field in META_FIELDS:
        combined = combined.assign_coords(
            {field: ("model", _meta_coord([meta.get(m, {}).get(field) for m in models]))}
        )
    combined.attrs = {key: value for key, value in combined.attrs.items() if key in KEEP_ATTRS}
    return combined
