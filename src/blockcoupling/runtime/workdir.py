"""Training folders keyed to what they train: an interrupted job resumes in its folder; after
any change of config or code the key differs and the run starts afresh.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def keyed_work_dir(run_dir: str | Path, identity: str, code: str) -> Path:
    """``run_dir/work-<key>``, the key a hash of ``identity`` (e.g. the run config as JSON) and
    ``code`` (a hash of the training code); stale ``work*`` folders of ``run_dir`` are removed.
    """
    key = hashlib.sha256(f"{identity}\n{code}".encode()).hexdigest()[:12]
    run_dir = Path(run_dir)
    work = run_dir / f"work-{key}"
    for stale in run_dir.glob("work*"):
        if stale != work and stale.is_dir():
            shutil.rmtree(stale)
    return work
