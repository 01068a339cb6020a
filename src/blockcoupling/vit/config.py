"""The ViT stochastic-depth x weight-decay sweep, torch-free: one run's config, the learning-rate
schedule, and the grid the workflow builds its DAG from.

``ViTRunConfig`` is one trained model (architecture, DeiT-style recipe, the grid point);
``ViTPlan.from_config(section)`` is the one place where the config's ``vit:`` section becomes run
configs, grid labels (the ``{sd}``, ``{wd}``, ``{seed}`` wildcards) and extraction options.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from blockcoupling.jacobians.options import MeasureConfig

# dataset -> (channels, image side in pixels, classes)
DATASETS: dict[str, tuple[int, int, int]] = {"digits": (1, 8, 10), "cifar10": (3, 32, 10)}


@dataclass(frozen=True)
class ViTRunConfig:
    """One ViT of the sweep: data, architecture, recipe and its grid point.

    Data: ``dataset`` (digits or cifar10), ``split_seed`` and ``test_fraction`` (the seeded,
    stratified test split of digits; CIFAR-10 keeps its own). Architecture (timm/DeiT names):
    ``img_size`` (pixels), ``patch_size`` (pixels), ``in_chans``, ``embed_dim``, ``depth``
    (blocks), ``num_heads``, ``mlp_ratio``. Recipe: ``epochs``, ``batch_size``, peak ``lr``,
    ``min_lr`` (end of the cosine), ``warmup_lr`` (start of the linear warmup), ``warmup_epochs``,
    ``label_smoothing``, ``mixup_alpha`` (0 = off), ``random_crop_padding`` (pixels, 0 = off),
    ``horizontal_flip``. Grid point: ``drop_path_rate`` (stochastic depth, the last block's
    rate; linear from 0 over depth), ``weight_decay`` (AdamW), ``seed`` (initialisation, data
    order, drop-path and mixup draws).
    """

    dataset: str = "digits"
    split_seed: int = 0
    test_fraction: float = 0.2
    img_size: int = 8
    patch_size: int = 2
    in_chans: int = 1
    embed_dim: int = 32
    depth: int = 6
    num_heads: int = 2
    mlp_ratio: float = 4.0
    epochs: int = 24
    batch_size: int = 64
    lr: float = 3e-3
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6
    warmup_epochs: int = 3
    label_smoothing: float = 0.1
    mixup_alpha: float = 0.0
    random_crop_padding: int = 0
    horizontal_flip: bool = False
    drop_path_rate: float = 0.0
    weight_decay: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset {self.dataset!r} is not one of {', '.join(DATASETS)}")
        chans, side, _ = DATASETS[self.dataset]
        if (self.in_chans, self.img_size) != (chans, side):
            raise ValueError(
                f"model.in_chans={self.in_chans}, img_size={self.img_size} do not match "
                f"{self.dataset} ({chans} channel(s), {side} x {side} pixels); set them so"
            )
        for name in ("patch_size", "embed_dim", "depth", "num_heads", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"model/recipe.{name} must be >= 1, got {getattr(self, name)}")
        if self.img_size % self.patch_size:
            raise ValueError(
                f"model.patch_size={self.patch_size} does not divide img_size={self.img_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} does not divide embed_dim={self.embed_dim}"
            )
        if not 0 <= self.drop_path_rate < 1:
            raise ValueError(f"grid.drop_path_rate must be in [0, 1), got {self.drop_path_rate}")
        if self.weight_decay < 0:
            raise ValueError(f"grid.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(
                f"recipe.label_smoothing must be in [0, 1), got {self.label_smoothing}"
            )
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.mixup_alpha < 0 or self.random_crop_padding < 0 or self.mlp_ratio <= 0:
            raise ValueError(
                "recipe.mixup_alpha and random_crop_padding must be >= 0, mlp_ratio > 0"
            )
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError(
                f"recipe.warmup_epochs={self.warmup_epochs} must be in [0, epochs={self.epochs})"
            )
        if not 0 < self.min_lr <= self.lr or not 0 < self.warmup_lr <= self.lr:
            raise ValueError(
                f"recipe needs 0 < min_lr <= lr and 0 < warmup_lr <= lr; got lr={self.lr}, "
                f"min_lr={self.min_lr}, warmup_lr={self.warmup_lr}"
            )

    @property
    def n_patches(self) -> int:
        """Patch tokens per image (the blocks see one more: the class token)."""
        return (self.img_size // self.patch_size) ** 2

    @property
    def num_classes(self) -> int:
        """Classes of the dataset."""
        return DATASETS[self.dataset][2]

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (a rule param; ``ViTRunConfig(**d)`` rebuilds it)."""
        return asdict(self)


def learning_rate(step: int, steps_per_epoch: int, cfg: ViTRunConfig) -> float:
    """The learning rate of update ``step`` (0-based), set per update: linear from ``warmup_lr``
    to ``lr`` over ``warmup_epochs``, then a half cosine from ``lr`` to ``min_lr`` at the end.
    """
    warmup = cfg.warmup_epochs * steps_per_epoch
    total = cfg.epochs * steps_per_epoch
    if step < warmup:
        return cfg.warmup_lr + (cfg.lr - cfg.warmup_lr) * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def grid_label(value: float) -> str:
    """A grid value as its wildcard (shortest round-trip form: 0.1, 0, 1e-05)."""
    return format(float(value), "g") if float(value) != 0 else "0"


EXTRACT_KEYS = ("k_max", "variants", "depth_token", "token_layers")


def measure_config(extract: Mapping[str, Any], chunk_size: int | None = None) -> MeasureConfig:
    """The ``MeasureConfig`` of a ``vit.extract`` section (``chunk_size``: run-only)."""
    values = {key: extract[key] for key in EXTRACT_KEYS if key in extract}
    return MeasureConfig.from_config(
        values | {"token_prompts": extract["token_images"], "chunk_size": chunk_size}
    )


def science_extract(extract: Mapping[str, Any]) -> dict[str, Any]:
    """The ``vit.extract`` keys that change results (the extraction rule's params), sorted so
    that the order of keys in a config file does not count as a change.
    """
    return {key: extract[key] for key in sorted(extract) if key != "chunk_size"}


@dataclass(frozen=True)
class ViTPlan:
    """The checked ``vit:`` section: every grid point's run config, labels and extraction."""

    section: dict[str, Any]
    sd: dict[str, float]  # wildcard label -> drop-path rate
    wd: dict[str, float]  # wildcard label -> weight decay
    seeds: tuple[int, ...]
    base: dict[str, Any]  # run-config fields other than the grid point
    measure: MeasureConfig

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
        sd = _labels("grid.drop_path_rate", grid["drop_path_rate"])
        wd = _labels("grid.weight_decay", grid["weight_decay"])
        seeds = tuple(int(s) for s in grid["seeds"])
        if len(set(seeds)) != len(seeds):
            raise ValueError("grid.seeds has a repeated seed")
        for rate in sd.values():
            for decay in wd.values():
                ViTRunConfig(**base, drop_path_rate=rate, weight_decay=decay, seed=seeds[0])
        extract = section["extract"]
        measure = measure_config(extract, extract.get("chunk_size"))
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
        ks = section["ks"]
        if max(ks) > measure.k_max:
            raise ValueError(f"ks has K={max(ks)} > extract.k_max={measure.k_max}; lower it")
        if section.get("k") is not None and section["k"] not in ks:
            raise ValueError(f"k={section['k']} is not in ks {ks}; add it there")
        return cls(section, sd, wd, seeds, base, measure)

    @property
    def points(self) -> list[tuple[str, str, int]]:
        """Every grid point as wildcards ``(sd, wd, seed)``."""
        return [(s, w, seed) for s in self.sd for w in self.wd for seed in self.seeds]

    def run(self, sd: str, wd: str, seed: int | str) -> ViTRunConfig:
        """The run config of a grid point given by its wildcards."""
        return ViTRunConfig(
            **self.base, drop_path_rate=self.sd[sd], weight_decay=self.wd[wd], seed=int(seed)
        )

    @property
    def k(self) -> int:
        """The K of the ViT statistics and figures (``k``, or the first of ``ks``)."""
        return int(
            self.section["k"] if self.section.get("k") is not None else self.section["ks"][0]
        )

    @property
    def data_file(self) -> str:
        """The prepared dataset (train and test arrays) all runs read."""
        return f"results/vit/data/{self.section['dataset']}.npz"

    def folder(self, kind: str, sd: str, wd: str, seed: int | str) -> str:
        """``results/vit/{kind}/sd{sd}/wd{wd}/seed{seed}`` (kind: train or extract)."""
        return f"results/vit/{kind}/sd{sd}/wd{wd}/seed{seed}"

    def parts(self) -> list[dict[str, Any]]:
        """Each grid point's files for the combined dataset, named together: ``point``
        ``[drop-path rate, weight decay, seed]``, its ``depth`` and ``tokens`` statistics and
        its training ``history`` (``vit.results.read_part`` checks them against the point).
        """
        out = []
        for sd, wd, seed in self.points:
            extract, train = (
                self.folder("extract", sd, wd, seed),
                self.folder("train", sd, wd, seed),
            )
            out.append(
                {
                    "point": [self.sd[sd], self.wd[wd], int(seed)],
                    "depth": f"{extract}/depth.nc",
                    "tokens": f"{extract}/tokens.nc",
                    "history": f"{train}/history.csv",
                }
            )
        return out


def _labels(key: str, values: list[float]) -> dict[str, float]:
    """Wildcard label -> value, refusing repeats (values that print alike)."""
    labels: dict[str, float] = {}
    for value in values:
        label = grid_label(value)
        if label in labels:
            raise ValueError(f"{key} repeats {value} (labels must be distinct)")
        labels[label] = float(value)
    return labels
