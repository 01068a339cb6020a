"""Trajectory metrics of token embeddings over depth (science.md, "Trajectory metrics").

Every function takes the residual-stream states `x` of one prompt, shape `(layer, token, d)`,
with layer = 0..L (0: input embedding of the first block, L: output of the last block), as a
numpy array or a torch tensor, and returns float64 numpy arrays. Lengths are in the units of
the hidden states (no normalisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _as_states(x: Any, min_layers: int = 2) -> np.ndarray:
    """Return `x` as a float64 array `(layer, token, d)` with at least `min_layers` states."""
    if hasattr(x, "detach"):  # torch tensor (any dtype, any device)
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 3:
        raise ValueError(f"states must have shape (layer, token, d), got shape {arr.shape}")
    if arr.shape[0] < min_layers:
        raise ValueError(f"need at least {min_layers} states (layers 0..L), got {arr.shape[0]}")
    if arr.shape[1] < 1 or arr.shape[2] < 1:
        raise ValueError(f"states need at least one token and one dimension, got shape {arr.shape}")
    return arr


def step_norms(x: Any) -> np.ndarray:
    """Step lengths `s_l = ||x^l - x^{l-1}||_2`, l = 1..L: `(layer, token, d)` -> `(L, token)`."""
    arr = _as_states(x)
    return np.linalg.norm(np.diff(arr, axis=0), axis=-1)


def line_shape_score(x: Any) -> np.ndarray:
    """Line-shape score of Gai & Zhang (2021) per token: `(layer, token, d)` -> `(token,)`.

    Unit steps `u_l = (x^l - x^{l-1}) / ||x^l - x^{l-1}||` are chained, and
    `LSS = L / ||sum_l u_l||` (>= 1; 1 iff all steps point the same way). A zero step has no
    direction, so a token with any zero step (or with unit steps summing to zero) gets NaN.
    """
    steps = np.diff(_as_states(x), axis=0)  # (L, token, d)
    norms = np.linalg.norm(steps, axis=-1, keepdims=True)  # (L, token, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        units = np.where(norms > 0, steps / norms, np.nan)
        end = np.linalg.norm(units.sum(axis=0), axis=-1)  # ||x~^L - x~^0||, (token,)
        return np.where(end > 0, steps.shape[0] / end, np.nan)


def _coefficient_of_variation(v: np.ndarray) -> np.ndarray:
    """Population CV (std with ddof=0 over axis 0, divided by the mean); NaN where mean is 0."""
    mean = v.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean != 0, v.std(axis=0, ddof=0) / mean, np.nan)


def expodistance(x: Any) -> np.ndarray:
    """Expodistance per token: `(layer, token, d)` -> `(token,)`, needs L >= 2 blocks.

    Ratios of consecutive step lengths `r_l = s_{l+1} / s_l` (l = 1..L-1);
    `ED = std(r) / mean(r)` with the population std (ddof=0). ED = 0 for exactly exponential
    spacing `s_l = C a^l`. NaN for a token with a zero step (its ratio is undefined).
    """
    s = step_norms(_as_states(x, min_layers=3))  # (L, token)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(s[:-1] > 0, s[1:] / s[:-1], np.nan)  # (L-1, token)
    return _coefficient_of_variation(r)


def spacing_cv(x: Any) -> np.ndarray:
    """Equal-spacing measure per token: `(layer, token, d)` -> `(token,)`.

    `std(s) / mean(s)` of the step lengths s_l, l = 1..L, population std (ddof=0);
    0 for equidistant states, NaN for a token that never moves.
    """
    return _coefficient_of_variation(step_norms(x))


def pca_projection(x: Any, n_components: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Project all states onto the principal components of the last layer's token embeddings.

    PCA is fitted (numpy SVD) on `x[L]` `(token, d)` centred by its token mean `mu`; every
    layer is projected as `(x^l - mu) @ V` with the same `mu`. Each component's sign is fixed so
    that its largest-magnitude loading is positive (deterministic output).
    Returns `projections (layer, token, pc)` and `explained_variance_ratio (pc,)`, the share of
    the last layer's total variance carried by each component.
    """
    arr = _as_states(x, min_layers=1)
    n_tokens, d = arr.shape[1], arr.shape[2]
    if n_tokens < 2:
        raise ValueError(f"PCA needs at least 2 tokens, got {n_tokens}")
    if not 1 <= n_components <= min(n_tokens, d):
        raise ValueError(
            f"n_components must be in 1..{min(n_tokens, d)} (tokens={n_tokens}, d={d}), "
            f"got {n_components}"
        )
    mean = arr[-1].mean(axis=0)  # (d,)
    _, sing, vt = np.linalg.svd(arr[-1] - mean, full_matrices=False)  # vt: (min(token, d), d)
    total = float(np.sum(sing**2))
    if total == 0.0:
        raise ValueError("last-layer embeddings are identical across tokens: PCA is undefined")
    comps = vt[:n_components]  # (pc, d)
    biggest = np.argmax(np.abs(comps), axis=1)
    comps = comps * np.sign(comps[np.arange(n_components), biggest])[:, None]
    projections = (arr - mean) @ comps.T  # (layer, token, pc)
    return projections, sing[:n_components] ** 2 / total
