"""A DeiT-style Vision Transformer with per-sample stochastic depth (drop path).

Built like timm's ``VisionTransformer`` (class token, learned position embedding, pre-norm
blocks ``x + drop_path(attn(norm1(x)))``, ``x + drop_path(mlp(norm2(x)))``, LayerNorm eps 1e-6,
drop-path rates rising linearly from 0 to ``drop_path_rate`` over depth, truncated-normal
initialisation, head on the class token) and with its parameter names, so state dicts carry over.
timm itself is not used: it imports torchvision, and no torchvision wheel here loads against the
CPU build of torch. Attention has timm's ``fused_attn`` switch (``scaled_dot_product_attention``
when on, explicit softmax when off); ``measure.eager_attention`` turns it off for Jacobians.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from blockcoupling.vit.config import ViTRunConfig


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Zero each sample's branch ``x (batch, ...)`` with probability ``rate`` (training only),
    scaling the kept ones by ``1 / (1 - rate)``. Draws from torch's global generator.
    """
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    """Stochastic depth of one residual branch (``drop_path`` with this module's rate)."""

    def __init__(self, rate: float = 0.0):
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (batch, token, d)`` with whole samples dropped in training."""
        return drop_path(x, self.rate, self.training)


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch x patch`` patches, linearly embedded (a strided convolution)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, C, H, W)`` -> ``(batch, patches, d)``, patches in row-major order."""
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention (qkv with bias), all tokens attend to all."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, token, d)`` -> ``(batch, token, d)``."""
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    """``fc2(gelu(fc1(x)))`` with hidden width ``mlp_ratio * d``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d)`` -> ``(..., d)``."""
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block; each residual branch has its own drop path."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, drop_path_rate: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.drop_path1 = DropPath(drop_path_rate)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path2 = DropPath(drop_path_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, token, d)`` -> ``(batch, token, d)``."""
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    """ViT with a class token; ``forward(x)`` maps images ``(batch, C, H, W)`` to class logits.

    The blocks (``self.blocks``, the adapter table's path) see ``1 + patches`` tokens, the class
    token first.
    """

    def __init__(
        self,
        img_size: int,
        patch_size: int,
        in_chans: int,
        num_classes: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.0,
    ):
        super().__init__()
        self.embed_dim = embed_dim
        n_patches = (img_size // patch_size) ** 2
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n_patches + 1, embed_dim))
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, rate) for rate in rates)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """The initialisation of timm's ViT: truncated normal (std 0.02) for the position embedding
        and every linear weight, zero biases, unit LayerNorms, class token N(0, 1e-6).
        """
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters exempt from weight decay besides biases and norms (as in timm)."""
        return {"pos_embed", "cls_token"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(batch, C, H, W)`` -> logits ``(batch, classes)``."""
        tokens = self.patch_embed(x)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embed
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens)[:, 0])


def build_vit(cfg: ViTRunConfig) -> VisionTransformer:
    """The (untrained) model of a run config, initialised from torch's current generator."""
    return VisionTransformer(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        drop_path_rate=cfg.drop_path_rate,
    )


def load_vit(
    weights: str | Path, cfg: ViTRunConfig, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> VisionTransformer:
    """A trained model from its safetensors file, in eval mode (no drop path)."""
    model = build_vit(cfg)
    model.load_state_dict(load_file(str(weights)))
    return model.to(device=device, dtype=dtype).eval()
