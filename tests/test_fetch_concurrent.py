"""Fetching under concurrency and hashes that cannot be switched off, against the local hub
(tests/hub_server.py): four fetches of one revision at once leave one complete folder that
loads; the manifest lists what the hub lists, not what is on disk; a manifest without hashes,
or a lock it disagrees with, is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import MODEL, LocalHub, build, main_job_spec

from blockcoupling.lm.hub import cache as hub_cache
from blockcoupling.lm.hub import content
from blockcoupling.lm.hub import fetch as hub
from blockcoupling.lm.hub import lock as lockfile

FOUR = 4


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    build(root)
    return root


def online(server: LocalHub) -> dict[str, str]:
    environ = {**os.environ, "HF_ENDPOINT": server.endpoint}
    for name in hub.OFFLINE:
        environ.pop(name, None)
    return environ


def fetch_command(folder: Path, revision: str = "main") -> list[str]:
    return [sys.executable, "-m", "blockcoupling.cli", "fetch", MODEL, revision, str(folder)]


def fetched(tmp_path: Path, hub_root: Path, revision: str = "main") -> Path:
    """``MODEL`` at ``revision`` fetched once into a hub cache under ``tmp_path``."""
    folder = tmp_path / "cache" / "models" / MODEL / revision
    with LocalHub(hub_root) as server:
        done = subprocess.run(
            fetch_command(folder, revision), env=online(server), capture_output=True, text=True
        )
    assert done.returncode == 0, done.stderr
    return folder


def test_four_fetches_at_once_leave_one_complete_folder_that_loads(
    hub_root: Path, tmp_path: Path
) -> None:
    from blockcoupling.lm.models import load_for_job

    folder = tmp_path / "cache" / "models" / MODEL / "main"
    with LocalHub(hub_root) as server:
        runs = [
            subprocess.Popen(
                fetch_command(folder),
                env=online(server),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(FOUR)
        ]
        outcomes = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    assert [code for code, _ in outcomes] == [0] * FOUR, outcomes
    served = hub_root / "models" / MODEL / "main"
    wanted = sorted(  # what a model fetch takes: config, tokenizer, safetensors weights
        p.name for p in served.iterdir() if p.suffix in (".json", ".txt", ".safetensors")
    )
    assert sorted(p.name for p in folder.iterdir()) == wanted
    for name in wanted:
        assert (folder / name).read_bytes() == (served / name).read_bytes(), name
    manifest = json.loads(hub_cache.manifest_of(folder).read_text())
    assert sorted(manifest["files"]) == sorted(manifest["hashes"]) == wanted
    assert hub_cache.require(folder, "models.neox", MODEL, "main") == folder
    assert [p.name for p in folder.parent.iterdir() if ".partial" in p.name] == []
    mask = os.umask(0)
    os.umask(mask)
    assert folder.stat().st_mode & 0o777 == 0o777 & ~mask  # a private folder no longer
    spec = main_job_spec(folder)
    model, tokenizer, _ = load_for_job(spec)
    assert len(tokenizer("the cat").input_ids) == 2
    assert sum(p.numel() for p in model.parameters()) > 0


LOSING_ONE = """
import sys
from pathlib import Path
from blockcoupling.lm.hub import fetch as hub
hub.go_online()
import huggingface_hub
real = huggingface_hub.snapshot_download
def losing_one(*args, **kwargs):  # a download that lacks one file the hub lists
    where = real(*args, **kwargs)
    (Path(kwargs["local_dir"]) / "tokenizer.json").unlink()
    return where
huggingface_hub.snapshot_download = losing_one
try:
    hub.fetch_model(sys.argv[1], "main", sys.argv[2])
except OSError as error:
    print(error)
"""


def test_the_manifest_lists_the_hubs_files_not_what_is_on_disk(
    hub_root: Path, tmp_path: Path
) -> None:
    """A download that lacks a file the hub lists (another fetcher deleted it, a network cut)
    is refused; it never becomes a folder whose manifest vouches for the files left."""
    folder = tmp_path / "cache" / "models" / MODEL / "main"
    with LocalHub(hub_root) as server:
        done = subprocess.run(
            [sys.executable, "-c", LOSING_ONE, MODEL, str(folder)],
            env=online(server),
            capture_output=True,
            text=True,
        )
    assert done.returncode == 0, done.stderr
    assert "tokenizer.json" in done.stdout and "differs from the hub's list" in done.stdout
    assert not folder.exists()


@pytest.mark.parametrize("hashes", ["deleted", [], {}, "thinned"])
def test_a_manifest_without_hashes_is_refused(hub_root: Path, tmp_path: Path, hashes) -> None:
    folder = fetched(tmp_path, hub_root)
    where = hub_cache.manifest_of(folder)
    manifest = json.loads(where.read_text())
    if hashes == "deleted":
        del manifest["hashes"]
    elif hashes == "thinned":
        del manifest["hashes"]["model.safetensors"]
    else:
        manifest["hashes"] = hashes
    where.write_text(json.dumps(manifest))
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # a flipped bit in the weights, at their size
    weights.write_bytes(bytes(data))
    with pytest.raises(hub_cache.HubCacheError) as error:
        hub_cache.require(folder, "models.neox", MODEL, "main")
    message = str(error.value)
    assert "\n" not in message
    assert f"lists {folder}/" in message
    assert "without the content hash the hub gives every file" in message


@pytest.mark.parametrize("hashes", ["deleted", "updated"])
def test_a_lock_pins_every_files_hash(hub_root: Path, tmp_path: Path, hashes: str) -> None:
    """A weights file swapped, its manifest hash updated (or the hashes deleted): the lock,
    which pins the hash of every file fetched at that commit, stops the run."""
    folder = fetched(tmp_path, hub_root)
    where = hub_cache.manifest_of(folder)
    manifest = json.loads(where.read_text())
    lock = tmp_path / "hub.lock"
    lockfile.record(lock, "model", MODEL, "main", manifest["commit"], manifest["hashes"])
    assert lockfile.stale(folder, where, lock, "model", MODEL, "main") == ""
    (folder / "model.safetensors").write_bytes(b"other weights")
    if hashes == "deleted":
        del manifest["hashes"]
    else:
        manifest["hashes"]["model.safetensors"] = content.file_hash(folder / "model.safetensors")
        manifest["files"]["model.safetensors"] = len(b"other weights")
    where.write_text(json.dumps(manifest))
    reason = lockfile.stale(folder, where, lock, "model", MODEL, "main")
    assert reason.startswith(f"{where} lists other content hashes for {MODEL}@main")
