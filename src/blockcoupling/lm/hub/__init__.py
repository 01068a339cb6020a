"""The hub room: everything that touches the Hugging Face hub and its local copy.

Inside (private to the room; only this package imports them):

- ``fetch``: fetching model revisions and prompt datasets where the network is (the login node);
- ``cache``: the cache folders and their manifests, read back and checked offline by compute jobs;
- ``names``: repo ids and revisions as the hub accepts them, paths kept inside their folder;
- ``revisions``: the hub revisions a config names and the order fetches may run in;
- ``lock``: the lock file, the commit each fetched revision resolved to;
- ``content``: the hub's content hashes of fetched files.

The boundary: code outside the room (the rest of ``lm``, ``pipeline``, the CLI, scripts and the
Snakefile) imports the names below from ``blockcoupling.lm.hub`` and nothing from its modules
(``tests/test_layout.py`` checks it). The workflow's settings of the hub (``hub:`` in the
config: cache folder, manifests, lock file, revision bound) are ``pipeline.hub_settings`` and
``pipeline.hub_volume``, which read the room through these names only.

Examples
--------
>>> from blockcoupling.lm import hub
>>> hub.check_revision("step1000")
'step1000'
"""

from blockcoupling.lm.hub.cache import (
    HubCacheError,
    checkpoints_on_disk,
    incomplete,
    missing_files,
    require,
    write_manifest,
)
from blockcoupling.lm.hub.fetch import fetch_dataset, fetch_model, go_online
from blockcoupling.lm.hub.lock import LockError, adopt_all, locked_commit, read_lock, record, stale
from blockcoupling.lm.hub.names import (
    HubNameError,
    check_fetch_folder,
    check_repo_id,
    check_revision,
    contained,
)
from blockcoupling.lm.hub.revisions import Revision, hub_revisions, predecessor, revision_of

__all__ = [
    "HubCacheError",
    "HubNameError",
    "LockError",
    "Revision",
    "adopt_all",
    "check_fetch_folder",
    "check_repo_id",
    "check_revision",
    "checkpoints_on_disk",
    "contained",
    "fetch_dataset",
    "fetch_model",
    "go_online",
    "hub_revisions",
    "incomplete",
    "locked_commit",
    "missing_files",
    "predecessor",
    "read_lock",
    "record",
    "require",
    "revision_of",
    "stale",
    "write_manifest",
]
