"""What the statistics and figures read from a coupling dataset, in one type each: one K,
reading, variant and norm (``Selection``), and the intervals' settings (``Bootstrap``). Plain
data with no heavy imports: the workflow builds them when it checks the config. Both are
builtin containers (a dict, a tuple), so that a rule passing one as a param re-runs when it
changes (Snakemake compares only builtin params).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

COORDINATES = ("k", "reading", "variant", "norm")


class Selection(dict):
    """One value per coupling coordinate: what a table or figure reads of a coupling dataset.

    A read-only dict of the four, so ``core.select(obj, **selection)`` picks them (a
    coordinate the object lacks is skipped).

    Parameters
    ----------
    k : int or None
        The K of m_K (None: the dataset has no K dim).
    reading : str
        The m_K reading (``authors``, ``offdiag``).
    variant : str
        The basis variant (``ujv``, ``vju``).
    norm : str
        The norm of m_K (``p``, ``trace``).

    Examples
    --------
    >>> import blockcoupling as bc
    >>> at = bc.Selection(k=10)
    >>> at.at(30).k, at.reading
    (30, 'authors')
    """

    def __init__(
        self, k: int | None = 10, reading: str = "authors", variant: str = "ujv", norm: str = "p"
    ) -> None:
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
            raise TypeError(f"Selection(k=...): expected an int or None, got {k!r}")
        for key, value in (("reading", reading), ("variant", variant), ("norm", norm)):
            if not isinstance(value, str):
                raise TypeError(f"Selection({key}=...): expected a str, got {value!r}")
        super().__init__(k=k, reading=reading, variant=variant, norm=norm)

    @property
    def k(self) -> int | None:
        """The K of m_K (None: the dataset has no K dim)."""
        return self["k"]

    @property
    def reading(self) -> str:
        """The m_K reading (authors, offdiag)."""
        return self["reading"]

    @property
    def variant(self) -> str:
        """The basis variant (ujv, vju)."""
        return self["variant"]

    @property
    def norm(self) -> str:
        """The norm of m_K (p, trace)."""
        return self["norm"]

    def at(self, k: int | None) -> Selection:
        """The same selection at another K.

        Parameters
        ----------
        k : int or None
            The new K.

        Returns
        -------
        Selection
            A copy with ``k`` replaced; this object is unchanged.
        """
        return Selection(k, self.reading, self.variant, self.norm)

    def every_k(self) -> dict[str, object]:
        """The coordinates other than K (reading, variant, norm), for a sweep over K."""
        return {key: self[key] for key in COORDINATES if key != "k"}

    def __repr__(self) -> str:
        return "Selection(" + ", ".join(f"{key}={self[key]!r}" for key in COORDINATES) + ")"

    def __reduce__(self) -> tuple:
        """Pickled as its constructor call (a job's params are pickled into its script)."""
        return Selection, (self.k, self.reading, self.variant, self.norm)

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a Selection is read-only: build another (Selection(...), .at(k))")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only


class Bootstrap(NamedTuple):
    """Percentile bootstrap settings: resamples (0: point estimates only, no interval), the
    seed every cell's generator derives from, and the confidence level of every interval.
    """

    n_boot: int = 1000
    seed: int = 0
    ci: float = 0.95


POINT = Bootstrap(n_boot=0)  # the means alone: tables whose numbers n_boot must not change
