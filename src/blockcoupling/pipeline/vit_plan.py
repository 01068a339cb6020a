"""The ViT sweep's checked plan and its result paths: ``ViTPlan.from_config(section)`` is the one
place where the config's ``vit:`` section becomes run configs, grid labels (the
``{drop_path_rate}``, ``{weight_decay}``, ``{seed}`` wildcards, written ``sd<label>``,
``wd<label>``, ``seed<n>`` in paths) and extraction options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from blockcoupling.jacobians.options import ExtractConfig, check_stored_ks, stored_ks
from blockcoupling.vit.config import DATASETS, ViTRunConfig, extract_config


def grid_label(value: float) -> str:
    """A grid value as its wildcard (shortest round-trip form: 0.1, 0, 1e-05)."""
    return format(float(value), "g") if float(value) != 0 else "0"


def science_extract(extract: Mapping[str, Any]) -> dict[str, Any]:
    """The ``vit.extract`` keys that change results (the extraction rule's params), sorted so
    that the order of keys in a config file does not count as a change.
    """
    return {key: extract[key] for key in sorted(extract) if key != "chunk_size"}


@dataclass(frozen=True)
class ViTPlan:
    """The checked ``vit:`` section: every grid point's run config, labels and extraction.

    ``drop_path_rate`` and ``weight_decay``: wildcard label -> the value (a float, as in
    ``ViTRunConfig``); ``base``: run-config fields other than the grid point; ``extract``: the
    ``vit.extract`` keys that change results; ``images``: test images measured per ViT.
    """

    drop_path_rate: dict[str, float]
    weight_decay: dict[str, float]
    seeds: tuple[int, ...]
    base: dict[str, Any]
    extraction: ExtractConfig
    extract: dict[str, Any]
    images: int
    ks: tuple[int, ...]  # the K list of the ViT metrics (``vit.ks``)
    k: int  # the K of the ViT statistics and figures (``vit.k``, else the first of ``ks``)
    data_dir: str
    device: str
    threads: int

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> ViTPlan:
        """From the config's ``vit:`` section (schema defaults filled in). Raises ValueError with
        the key and the fix; every grid point's ``ViTRunConfig`` is built (and so checked).
        """
        section = dict(section)
        base = {
            "dataset": section["dataset"],
            "split_seed": section["split_seed"],
            "test_fraction": section["test_fraction"],
        }
        chans, side, _ = DATASETS.get(section["dataset"], (None, None, None))
        model = dict(section["model"])
        model["in_chans"] = chans if model.get("in_chans") is None else model["in_chans"]
        model["img_size"] = side if model.get("img_size") is None else model["img_size"]
        base.update(model)
        base.update(section["recipe"])
        known = {f.name for f in fields(ViTRunConfig)}
        unknown = sorted(set(base) - known)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} under model/recipe")
        grid = section["grid"]
        drop_path_rate = _labels("grid.drop_path_rate", grid["drop_path_rate"])
        weight_decay = _labels("grid.weight_decay", grid["weight_decay"])
        seeds = tuple(int(s) for s in grid["seeds"])
        if len(set(seeds)) != len(seeds):
            raise ValueError("grid.seeds has a repeated seed")
        for rate in drop_path_rate.values():
            for decay in weight_decay.values():
                ViTRunConfig(**base, drop_path_rate=rate, weight_decay=decay, seed=seeds[0])
        ks = tuple(int(k) for k in section["ks"])
        if max(ks) > section["extract"]["k_max"]:
            raise ValueError(
                f"ks has K={max(ks)} > extract.k_max={section['extract']['k_max']}; lower it"
            )
        extract = {**section["extract"], "stored_ks": stored_ks(section["extract"], ks, "vit.")}
        measure = extract_config(extract, extract.get("chunk_size"))
        d, n_tokens = base["embed_dim"], ViTRunConfig(**base).n_patches + 1
        if measure.k_max > d:
            raise ValueError(f"extract.k_max={measure.k_max} exceeds embed_dim={d}; lower it")
        if not -n_tokens <= measure.depth_token < n_tokens:
            raise ValueError(
                f"extract.depth_token={measure.depth_token} is outside the {n_tokens} tokens "
                "(0 = class token)"
            )
        depth = base["depth"]
        bad = [t for t in measure.token_layers if not 1 <= (t if t > 0 else t + depth + 1) <= depth]
        if bad:
            raise ValueError(f"extract.token_layers {bad} are outside 1..{depth} (or -{depth}..-1)")
        if extract["images"] < extract["token_images"]:
            raise ValueError("extract.token_images must be <= extract.images")
        check_stored_ks(measure, ks, "vit.")
        if section.get("k") is not None and section["k"] not in ks:
            raise ValueError(f"k={section['k']} is not in ks {list(ks)}; add it there")
        return cls(
            drop_path_rate,
            weight_decay,
            seeds,
            base,
            measure,
            science_extract(extract),
            int(extract["images"]),
            ks,
            int(section["k"] if section.get("k") is not None else ks[0]),
            str(section["data_dir"]),
            str(section["device"]),
            int(section["threads"]),
        )

    @property
    def points(self) -> list[tuple[str, str, int]]:
        """Every grid point as wildcards ``(drop_path_rate, weight_decay, seed)``."""
        return [
            (rate, decay, seed)
            for rate in self.drop_path_rate
            for decay in self.weight_decay
            for seed in self.seeds
        ]

    def run(self, drop_path_rate: str, weight_decay: str, seed: int | str) -> ViTRunConfig:
        """The run config of a grid point given by its wildcards."""
        return ViTRunConfig(
            **self.base,
            drop_path_rate=self.drop_path_rate[drop_path_rate],
            weight_decay=self.weight_decay[weight_decay],
            seed=int(seed),
        )

    @property
    def data_file(self) -> str:
        """The prepared dataset (train and test arrays) all runs read."""
        return f"results/vit/data/{self.base['dataset']}.npz"

    def parts(self) -> list[dict[str, Any]]:
        """Each grid point's files for the combined dataset, named together: ``point``
        ``[drop-path rate, weight decay, seed]``, its ``depth`` and ``tokens`` statistics and
        its training ``history`` (``vit.results.read_part`` checks them against the point).
        """
        out = []
        for rate, decay, seed in self.points:
            extract, train = (
                vit_folder("extract", rate, decay, seed),
                vit_folder("train", rate, decay, seed),
            )
            out.append(
                {
                    "point": [self.drop_path_rate[rate], self.weight_decay[decay], int(seed)],
                    "depth": f"{extract}/depth.nc",
                    "tokens": f"{extract}/tokens.nc",
                    "history": f"{train}/history.csv",
                }
            )
        return out


def vit_folder(kind: str, drop_path_rate: str, weight_decay: str, seed: int | str) -> str:
    """``results/vit/{kind}/sd{rate}/wd{decay}/seed{seed}`` (kind: train or extract; the rate
    and decay as their wildcard labels).
    """
    return f"results/vit/{kind}/sd{drop_path_rate}/wd{weight_decay}/seed{seed}"


def _labels(key: str, values: list[float]) -> dict[str, float]:
    """Wildcard label -> value, refusing repeats (values that print alike)."""
    labels: dict[str, float] = {}
    for value in values:
        label = grid_label(value)
        if label in labels:
            raise ValueError(f"{key} repeats {value} (labels must be distinct)")
        labels[label] = float(value)
    return labels
