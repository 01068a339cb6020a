"""One ViT of the stochastic-depth x weight-decay sweep, torch-free: its run config, the
learning-rate schedule and its extraction options.

``ViTRunConfig`` is one trained model (architecture, DeiT-style recipe, the grid point); the
workflow's checked plan of the whole sweep is ``pipeline.vit_plan.ViTPlan``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from blockcoupling.jacobians.options import ExtractConfig

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


EXTRACT_KEYS = ("k_max", "variants", "depth_token", "token_layers", "stored_ks")


def extract_config(extract: Mapping[str, Any], chunk_size: int | None = None) -> ExtractConfig:
    """The ``ExtractConfig`` of a ``vit.extract`` section (``chunk_size``: run-only)."""
    values = {key: extract[key] for key in EXTRACT_KEYS if key in extract}
    return ExtractConfig.from_config(  # the sweep's results read the token families' m_K only
        values
        | {"token_prompts": extract["token_images"], "chunk_size": chunk_size, "token_bases": False}
    )
