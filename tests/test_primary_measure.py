"""Why the primary measure is the excess at a K below every trained model's effective rank
(docs/science.md, "Which K"): with K above a Jacobian's effective rank, the excess of two
equally coupled Jacobians follows their rank, not their coupling."""

from __future__ import annotations

import numpy as np
import torch

from blockcoupling.coupling.null import spectrum_null
from blockcoupling.jacobians.statistics import mis_coupling

D = 64


def coupled_pair(rng: np.random.Generator, rank: int, tail: float = 0.1):
    """J_i, J_j (D x D) with the same spectrum (``rank`` values 1, the rest ``tail``) and the
    same top-``rank`` singular pairs (perfectly coupled there); their tails' directions are
    independent. Returns J_i, J_j and the spectrum.
    """
    s = np.r_[np.ones(rank), tail * np.ones(D - rank)]

    def basis(shared: np.ndarray | None) -> np.ndarray:
        q = np.linalg.qr(rng.normal(size=(D, D)))[0]
        if shared is None:
            return q
        rest = q - shared @ (shared.T @ q)  # the complement of the shared columns
        return np.c_[shared, np.linalg.qr(rest)[0][:, : D - rank]]

    u, v = basis(None), basis(None)
    u2, v2 = basis(u[:, :rank]), basis(v[:, :rank])
    return (u * s) @ v.T, (u2 * s) @ v2.T, s


def excess(j_i: np.ndarray, j_j: np.ndarray, s: np.ndarray, k: int) -> float:
    """Spectrum-matched null minus m_K (authors' reading, ujv, p-norm)."""
    m = mis_coupling(torch.tensor(j_i), torch.tensor(j_j), k)
    null, _ = spectrum_null(s[None, :k], np.array([np.sum(s**2)]), D, (k,), ("authors",), ("p",))
    return float(null.ravel()[0]) - m


def test_excess_follows_the_rank_when_k_exceeds_it_and_not_below_it():
    rng = np.random.default_rng(0)
    ranks = (2, 3, 4, 6, 8)
    at = {k: [] for k in (2, 8)}
    for rank in ranks:
        pairs = [coupled_pair(rng, rank) for _ in range(3)]
        for k in at:
            at[k].append(np.mean([excess(a, b, s, k) for a, b, s in pairs]))
    log_rank = np.log(ranks)
    # K = 8 above most ranks: the same perfect coupling reads as less coupled at lower rank
    assert np.corrcoef(log_rank, at[8])[0, 1] > 0.9 and at[8][-1] - at[8][0] > 0.05
    # K = 2 at or below every rank: no rise with the rank
    assert at[2][-1] - at[2][0] < 0.01 and np.ptp(at[2]) < 0.5 * (at[8][-1] - at[8][0])
