"""Trajectory metrics against hand-built trajectories and independent computations."""

import numpy as np
import pytest
import torch

from blockcoupling.jacobians.trajectories import (
    expodistance,
    line_shape_score,
    pca_projection,
    spacing_cv,
    step_norms,
)


def _line(step_lengths, direction, start):
    """States (layer, 1, d) moving along `direction` with the given step lengths."""
    offsets = np.concatenate([[0.0], np.cumsum(step_lengths)])
    return (start + offsets[:, None] * direction)[:, None, :]


def test_step_norms_match_loop():
    x = np.random.default_rng(0).normal(size=(5, 3, 4))
    expected = [
        [np.sqrt(np.sum((x[l, t] - x[l - 1, t]) ** 2)) for t in range(3)] for l in range(1, 5)
    ]
    np.testing.assert_allclose(step_norms(x), expected)


def test_lss_is_one_on_straight_line_with_uneven_steps():
    rng = np.random.default_rng(1)
    direction = rng.normal(size=6)
    x = _line([0.1, 3.0, 0.5, 7.0, 2.0], direction, rng.normal(size=6))
    np.testing.assert_allclose(line_shape_score(x), [1.0])


def test_lss_closed_form_on_zigzag():
    # Steps alternate (2, 0) and (0, 0.5) four times each: unit steps sum to (4, 4).
    steps = np.array([[2.0, 0.0], [0.0, 0.5]] * 4)
    x = np.concatenate([[[0.0, 0.0]], np.cumsum(steps, axis=0)])[:, None, :]
    np.testing.assert_allclose(line_shape_score(x), [8 / np.hypot(4, 4)])  # = sqrt(2)


def test_lss_at_least_one_on_random_data_and_torch_input():
    x = np.random.default_rng(2).normal(size=(9, 7, 5))
    lss = line_shape_score(x)
    assert lss.shape == (7,)
    assert np.all(lss >= 1.0)
    np.testing.assert_allclose(line_shape_score(torch.tensor(x, dtype=torch.float64)), lss)


def test_lss_zero_step_is_nan():
    x = np.zeros((3, 2, 2))
    x[1:, 0] = [1.0, 0.0]  # token 0: a unit step, then a zero step
    x[1, 1], x[2, 1] = [1.0, 0.0], [1.0, 1.0]  # token 1: two orthogonal unit steps
    out = line_shape_score(x)
    assert np.isnan(out[0])
    np.testing.assert_allclose(out[1], 2 / np.sqrt(2))


def test_expodistance_zero_on_geometric_steps_and_positive_otherwise():
    direction = np.array([0.6, 0.0, -0.8])
    geometric = _line(0.3 * 1.7 ** np.arange(1, 8), direction, np.ones(3))
    linear_growth = _line(np.arange(1.0, 8.0), direction, np.ones(3))
    x = np.concatenate([geometric, linear_growth], axis=1)
    ed = expodistance(x)
    assert ed[0] == pytest.approx(0.0, abs=1e-12)
    # r_l = (l+1)/l for l = 1..6: population CV computed by hand.
    r = np.arange(2.0, 8.0) / np.arange(1.0, 7.0)
    assert ed[1] == pytest.approx(np.sqrt(np.mean((r - r.mean()) ** 2)) / r.mean())
    assert ed[1] > 0


def test_spacing_cv_zero_on_equal_steps_and_known_value():
    rng = np.random.default_rng(3)
    equal = _line([0.7] * 6, rng.normal(size=4), rng.normal(size=4))
    # Steps of length 1 and 3 alternate: mean 2, population std 1.
    uneven = _line([1.0, 3.0] * 3, np.array([0.0, 1.0, 0.0, 0.0]), np.zeros(4))
    cv = spacing_cv(np.concatenate([equal, uneven], axis=1))
    np.testing.assert_allclose(cv, [0.0, 0.5], atol=1e-12)


def test_pca_last_layer_matches_covariance_eigenvectors():
    x = np.random.default_rng(4).normal(size=(4, 10, 6))
    proj, ratio = pca_projection(x, n_components=2)
    assert proj.shape == (4, 10, 2) and ratio.shape == (2,)
    centred = x[-1] - x[-1].mean(axis=0)
    evals, evecs = np.linalg.eigh(np.cov(centred, rowvar=False))
    order = np.argsort(evals)[::-1][:2]
    axes = evecs[:, order]
    axes = axes * np.sign(np.sum((centred @ axes) * proj[-1], axis=0))  # components: up to sign
    np.testing.assert_allclose(proj[-1], centred @ axes, atol=1e-10)
    np.testing.assert_allclose(ratio, evals[order] / evals.sum())
    assert ratio.sum() <= 1.0
    # Earlier layers use the last layer's mean and axes.
    np.testing.assert_allclose(proj[0], (x[0] - x[-1].mean(axis=0)) @ axes, atol=1e-10)


def test_pca_recovers_planar_trajectories_exactly():
    rng = np.random.default_rng(5)
    basis = np.linalg.qr(rng.normal(size=(8, 2)))[0]  # (d, 2) orthonormal
    coords = rng.normal(size=(6, 5, 2))  # (layer, token, 2)
    offset = rng.normal(size=8)
    x = coords @ basis.T + offset
    proj, ratio = pca_projection(x)
    assert ratio.sum() == pytest.approx(1.0)
    # Distances within the plane are preserved exactly by the projection.
    flat_p, flat_c = proj.reshape(-1, 2), coords.reshape(-1, 2)
    np.testing.assert_allclose(
        np.linalg.norm(flat_p[:, None] - flat_p[None], axis=-1),
        np.linalg.norm(flat_c[:, None] - flat_c[None], axis=-1),
        atol=1e-10,
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: pca_projection(np.ones((3, 1, 4))), "at least 2 tokens"),
        (lambda: pca_projection(np.ones((3, 4, 4))), "identical across tokens"),
        (lambda: pca_projection(np.random.rand(3, 4, 2), n_components=3), "n_components"),
        (lambda: step_norms(np.ones((3, 4))), r"shape \(layer, token, d\)"),
        (lambda: line_shape_score(np.ones((1, 2, 3))), "at least 2 states"),
        (lambda: expodistance(np.ones((2, 2, 3))), "at least 3 states"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
