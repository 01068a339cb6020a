"""CF-style labels of every NetCDF variable the workflow writes, from one table.

``label`` gives each data variable and coordinate a ``long_name`` and ``units`` (UDUNITS ``"1"``
for dimensionless quantities, counts, indices and labels: every quantity here is one) and the
file a ``Conventions`` attribute, so that xarray's plotting and CF tools read them. Names are
looked up exactly (``VARIABLES``), then as ``<family>_<statistic>`` of a Jacobian family
(``depth``, ``self``, ``fixed_in``, ``fixed_out``) with the statistic from ``FAMILY_STATISTICS``
or the measure registry (``coupling.registry.MEASURES``). ``files.io.write_netcdf`` calls it on
every file; a variable none of them names stops the write, naming it (add it to the table).
"""

from __future__ import annotations

import sys
from pathlib import Path

import xarray as xr

from blockcoupling.coupling.registry import MEASURES, summary_long_names

CONVENTIONS = "CF-1.11"
DIMENSIONLESS = "1"

# name -> long_name (units "1" unless given as a (long_name, units) pair)
VARIABLES: dict[str, str | tuple[str, str]] = {
    # dims and label coordinates (docs/datasets.md)
    "model": "model name (config key)",
    "init": "initialisation: trained, or random (the seeded random-init twin)",
    "step": "training step of the checkpoint",
    "prompt": "prompt id",
    "prompt_source": "task style or text the prompt comes from",
    "layer": "block index (Jacobians: block l maps state l-1 to l; trajectories: state, 0 = input)",
    "layer_ref": "reference block l' of the coupling pair",
    "token": "token position (0-based)",
    "token_ref": "reference token position of the coupling pair",
    "token_in": "fixed input token position t1",
    "token_out": "fixed output token position t2",
    "rank": "singular value index a (descending singular values)",
    "k": "number K of top singular triplets",
    "dim": "hidden dimension index",
    "pc": "principal component index",
    "variant": "coupling variant: ujv (A = U_j^T J_i V_j) or vju (A = V_j^T J_i U_j)",
    "reading": "m_K reading: authors (|| |A| - S_i ||_F) or offdiag (|| A - diag A ||_F)",
    "norm": "m_K normalisation: p (||S_i,K||_p) or trace (sum S_i,K)",
    "token_position": "token position of the depth-wise Jacobians",
    "n_tokens": "number of tokens of the prompt (token files: tokens the families cover)",
    # model metadata (combine.META_FIELDS)
    "params": "number of parameters",
    "n_layers": "number of blocks",
    "d_model": "hidden size d",
    "train_tokens": "number of training tokens",
    "score": "generalization score of the model table (leaderboard average)",
    "base": "base model (1) or instruction-tuned (0)",
    "family": "model family",
    "pos_encoding": "position encoding",
    "group": "run configuration without its seed (replicates share it)",
    "data_fraction": "fraction of the training text trained on",
    "weight_decay": "AdamW weight decay",
    "learning_rate": "peak learning rate",
    "seed": "training seed",
    # spectra and the Jacobians' sums
    "singular_values": "singular values of the block Jacobian J^l_{t1 t2}",
    "sv_sum2": "sum of squared singular values over the full spectrum (||J||_F^2)",
    "sv_sum4": "sum of fourth powers of singular values over the full spectrum",
    "u": "top-K left singular vectors of J^l_tt",
    "v": "top-K right singular vectors of J^l_tt",
    # metrics (coupling.metrics.coupling_dataset)
    "depth_null": "spectrum-matched null of m_K of J^layer (Haar-random bases, Monte Carlo)",
    "depth_null_se": "Monte Carlo standard error of depth_null",
    "effective_rank": "effective rank of J^layer: (sum s^2)^2 / sum s^4",
    **summary_long_names(),  # the registry's summaries, adjacent summaries and chance levels
    # trajectories
    "lss": "line-shape score of the token's trajectory",
    "expodistance": "expodistance of the token's trajectory",
    "spacing_cv": "coefficient of variation of the trajectory's step lengths",
    "step_norm": "step length ||x^l - x^(l-1)|| (NaN at state 0)",
    "pca": "trajectory projected on the prompt's principal components",
    "pca_explained": "fraction of variance explained by the principal component",
    # evaluate
    "bits_per_byte": "negative log-likelihood of the held-out text in bits per byte",
    "mc_accuracy": "multiple-choice accuracy by summed log-likelihood (fraction)",
    "mc_accuracy_norm": "multiple-choice accuracy by byte-normalised log-likelihood (fraction)",
    # ViT sweep (vit.results.grid_dataset)
    "sd": "stochastic-depth (drop-path) rate",
    "wd": "AdamW weight decay",
    "image": "test image id",
    "image_label": "class label of the test image",
    "token_image": "test image id of the token families",
    "token_layer": "block of the token families",
    "epoch": "training epoch",
    "test_accuracy": "test accuracy after training (fraction)",
    "test_loss": "test cross-entropy after training (nats per image)",
    "train_loss": "training cross-entropy after training (nats per image)",
    "test_accuracy_curve": "test accuracy after each epoch (fraction)",
    # statistics (stats.crossmodel.model_coupling)
    "n_prompts": "number of prompts with a finite value",
    "source": "prompt source",
}

# <family>_<statistic> of the stored sufficient statistics (docs/datasets.md)
FAMILY_STATISTICS = {
    "diag": "diagonal A[a, a] of A = P_j^T J_i Q_j",
    "corner": "cumulative corner sum of squares sum_{a,b<k} A[a, b]^2",
    "numerator2": "squared numerator (m_K times its normaliser)^2 at the stored K",
    "ucorner": "cumulative corner sum of squares of U_i^T U_j",
    "vcorner": "cumulative corner sum of squares of V_i^T V_j",
    "token_coupling": "token coupling: minus the mean m_K over token pairs t != t'",
}
FAMILIES = {
    "depth": "depth-wise",
    "self": "self token family",
    "fixed_in": "fixed-input token family",
    "fixed_out": "fixed-output token family",
}


# <variable><suffix> of the statistics' per-model summaries (stats.crossmodel.model_coupling)
SUFFIXES = {
    "_by_source": "{}, per prompt source",
    "_low": "lower bound of the bootstrap interval of {}",
    "_high": "upper bound of the bootstrap interval of {}",
}


def attributes(name: str) -> tuple[str, str] | None:
    """``(long_name, units)`` of a variable name, None when the table names it nowhere."""
    entry = VARIABLES.get(name)
    if entry is not None:
        return entry if isinstance(entry, tuple) else (entry, DIMENSIONLESS)
    for suffix, template in SUFFIXES.items():
        if name.endswith(suffix) and (base := attributes(name[: -len(suffix)])) is not None:
            return template.format(base[0]), base[1]
    for family, family_name in FAMILIES.items():
        if not name.startswith(f"{family}_"):
            continue
        statistic = name[len(family) + 1 :]
        if statistic in FAMILY_STATISTICS:
            return f"{family_name}: {FAMILY_STATISTICS[statistic]}", DIMENSIONLESS
        for measure in MEASURES:
            if measure.name == statistic:
                return f"{family_name}: {measure.description}", DIMENSIONLESS
    return None


# file name -> the ``title`` attribute of the files of that name (else ``title``'s fallback)
TITLES = {
    "depth.nc": "sufficient statistics of the depth-wise block Jacobians (one checkpoint)",
    "tokens.nc": "sufficient statistics of the token-wise block Jacobians (one checkpoint)",
    "spectra.nc": "singular values of the block Jacobians",
    "trajectories.nc": "hidden-state trajectories through the blocks: LSS, expodistance, PCA",
    "coupling.nc": "block coupling m_K and its summaries, with their chance levels",
    "token_coupling.nc": "token coupling m_K of the token families",
    "final.nc": "ViT: coupling, spectra and accuracy of one trained ViT",
    "combined.nc": "ViT sweep: coupling and accuracy over stochastic depth, weight decay, seed",
}
SOURCE = "blockcoupling {version}: block Jacobians of transformers (Aubry et al., ICLR 2025)"


def title(path: str | Path) -> str:
    """The ``title`` attribute of a file at ``path`` (``TITLES`` by its name)."""
    path = Path(path)
    return TITLES.get(path.name, f"blockcoupling results: {path.parent.name}/{path.stem}")


def label(dataset: xr.Dataset) -> xr.Dataset:
    """A copy of ``dataset`` whose every variable and coordinate has ``long_name`` and
    ``units`` (kept where the builder set them, except on a coordinate the table names: a
    renamed coordinate would carry its old name's label) and whose attrs say ``Conventions``.
    A ValueError names a variable the table does not know.
    """
    dataset = dataset.copy()
    for name in dataset.coords:
        if name in VARIABLES:
            dataset[name].attrs.pop("long_name", None)
    for name, variable in dataset.variables.items():
        if "long_name" in variable.attrs and "units" in variable.attrs:
            continue
        found = attributes(str(name))
        if found is None:
            raise ValueError(
                f"variable {name!r} has no long_name/units: add it to "
                "blockcoupling.files.cf.VARIABLES"
            )
        variable.attrs.setdefault("long_name", found[0])
        variable.attrs.setdefault("units", found[1])
    for variable in dataset.variables.values():  # the registry's prose unit is a comment
        if "unit" in variable.attrs:
            variable.attrs.setdefault("comment", variable.attrs.pop("unit"))
    dataset.attrs["Conventions"] = CONVENTIONS
    return dataset


def check_files(root: str | Path) -> tuple[int, int, list[str]]:
    """Open every NetCDF under ``root`` with xarray: ``(files, variables checked, problems)``,
    a problem being a variable or coordinate without ``long_name`` or ``units``, or a file
    without ``Conventions``, ``git_commit``, ``title``, ``history`` or ``source``.
    """
    files, checked, problems = 0, 0, []
    for path in sorted(Path(root).rglob("*.nc")):
        files += 1
        with xr.open_dataset(path, engine="netcdf4") as dataset:
            for key in ("Conventions", "git_commit", "title", "history", "source"):
                if key not in dataset.attrs:
                    problems.append(f"{path}: no {key} attribute")
            for name, variable in dataset.variables.items():
                checked += 1
                missing = [key for key in ("long_name", "units") if key not in variable.attrs]
                if missing:
                    problems.append(f"{path}: {name} has no {'/'.join(missing)}")
    return files, checked, problems


def main(argv: list[str] | None = None) -> int:
    """``python -m blockcoupling.files.cf RESULTS``: exit 1 naming every unlabelled variable."""
    root = (argv if argv is not None else sys.argv[1:] or ["results"])[0]
    files, checked, problems = check_files(root)
    for problem in problems:
        print(problem)
    print(f"{files} NetCDF files, {checked} variables and coordinates: {len(problems)} problems")
    return 1 if problems or not files else 0


if __name__ == "__main__":
    sys.exit(main())
