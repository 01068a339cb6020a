"""The workflow's ``hub:`` config section, checked once (``HubSettings``): where the hub cache
is, how many checkpoint revisions sit in it at once, whether compute jobs run offline. The cache
itself (fetching, its folders read back and checked, the revisions a config names, the lock
file) is the hub's room, ``lm.hub``, read only through the names its ``__init__`` exports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HubSettings:
    """The ``hub:`` config section: the shared cache folder, how many checkpoint revisions may
    sit in it at once, whether compute jobs run offline.
    """

    cache_dir: str = "hub_cache"
    max_revisions: int | None = 4  # None (``all`` in the config): every revision fetched ahead
    offline_jobs: bool = True
    lock_file: str | None = "hub.lock"

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> HubSettings:
        """From a schema-validated ``hub:`` section (``max_revisions: all`` -> None)."""
        section = dict(section)
        if section.get("max_revisions") == "all":
            section["max_revisions"] = None
        return cls(**section)

    @property
    def ahead(self) -> bool:
        """Whether every revision is fetched ahead (the fetch target) and kept: no lanes."""
        return self.max_revisions is None

    def folder(self, repo: str, revision: str, checkpoint: bool) -> str:
        """The folder a model revision is fetched into."""
        return f"{self.cache_dir}/{'checkpoints' if checkpoint else 'models'}/{repo}/{revision}"

    def dataset_folder(self, repo: str, revision: str = "main") -> str:
        """The folder a prompt dataset's revision is fetched into."""
        return f"{self.cache_dir}/datasets/{repo}/{revision}"

    def manifest(self, kind: str, repo: str, revision: str) -> str:
        """Where the manifest of a fetch (kind model, checkpoint or dataset) is kept."""
        return f"{self.cache_dir}/manifests/{kind}/{repo}/{revision}.json"

    def job_env(self) -> dict[str, str]:
        """The environment of compute jobs: the hub and datasets offline, datasets' Arrow cache
        in the shared cache.
        """
        if not self.offline_jobs:
            return {}
        return {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_DATASETS_CACHE": os.path.abspath(f"{self.cache_dir}/arrow"),
        }
