"""What the statistics and figures read from a coupling dataset, in one type each: one K,
reading, variant and norm (``Selection``), and the intervals' settings (``Bootstrap``). Plain
data with no heavy imports: the workflow builds them when it checks the config.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

COORDINATES = ("k", "reading", "variant", "norm")


@dataclass(frozen=True)
class Selection(Mapping[str, object]):
    """One value per coupling coordinate: ``k`` (None: the dataset has no K dim), ``reading``,
    ``variant`` and ``norm``. A mapping of those four, so ``core.select(obj, **selection)``
    picks them (a coordinate the object lacks is skipped).
    """

    k: int | None = 10
    reading: str = "authors"
    variant: str = "ujv"
    norm: str = "p"

    def __getitem__(self, key: str) -> object:
        if key not in COORDINATES:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(COORDINATES)

    def __len__(self) -> int:
        return len(COORDINATES)

    def at(self, k: int | None) -> Selection:
        """The same selection at another K."""
        return replace(self, k=k)

    def every_k(self) -> dict[str, object]:
        """The coordinates other than K (reading, variant, norm), for a sweep over K."""
        return {key: self[key] for key in COORDINATES if key != "k"}


@dataclass(frozen=True)
class Bootstrap:
    """Percentile bootstrap settings: resamples (0: point estimates only, no interval), the
    seed every cell's generator derives from, and the confidence level of every interval.
    """

    n_boot: int = 1000
    seed: int = 0
    ci: float = 0.95


POINT = Bootstrap(n_boot=0)  # the means alone: tables whose numbers n_boot must not change
