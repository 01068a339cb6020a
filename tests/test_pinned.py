"""Pinned inputs: prompt sources fetched at a configured revision, the commit fetched recorded
in the prompts' provenance and in the lock file, a fetch with the lock present fetching exactly
the locked commits, a changed pin re-running the prompts; against the local hub serving ARC at
two revisions (main and v1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import snakemake
from hub_server import ARC, CONFIG, LocalHub, build, commit_of

from blockcoupling.lm.hub import cache as hub_cache
from blockcoupling.lm.hub import fetch as hub
from blockcoupling.lm.hub import lock as lockfile


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    build(root)
    return root


def online_env(server: LocalHub, home: Path) -> dict[str, str]:
    """A process environment that talks to the local hub (huggingface_hub reads it at import)."""
    env = dict(os.environ, HF_ENDPOINT=server.endpoint, HF_HOME=str(home))
    for name in hub.OFFLINE:
        env.pop(name, None)
    return env


FETCH = """
import json, sys
from blockcoupling.lm.hub import fetch as hub
from blockcoupling.lm.hub import cache as hub_cache
from blockcoupling.lm.hub import cache as hub_cache
from blockcoupling.lm.hub import lock as lockfile
from blockcoupling.lm.hub import cache as hub_cache
from blockcoupling.lm.text import prompts
from blockcoupling.pipeline.hub_settings import HubSettings
repo, cache, revision, lock = sys.argv[1:5]
settings = HubSettings(cache_dir=cache)
target = settings.dataset_folder(repo, revision)
commit = lockfile.locked_commit(lock, "dataset", repo, revision)
manifest = hub.fetch_dataset(repo, "ARC-Challenge", target, revision, commit)
hub_cache.write_manifest(manifest, settings.manifest("dataset", repo, revision))
texts = [p.text for p in prompts.load_hub_prompts("arc", 5, 0, target)]
print(json.dumps({"commit": manifest["commit"], "revision": manifest["revision"], "texts": texts}))
"""


def fetch(server: LocalHub, tmp: Path, revision: str, lock: Path) -> dict:
    """hub.fetch_dataset as the fetch rule calls it (the lock's commit, when it has one)."""
    run = subprocess.run(
        [sys.executable, "-c", FETCH, ARC, str(tmp / "hub_cache"), revision, str(lock)],
        env=online_env(server, tmp / "home"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_dataset_is_fetched_at_its_revision_or_at_the_locked_commit(
    hub_root: Path, tmp_path: Path
) -> None:
    lock = tmp_path / "hub.lock"
    with LocalHub(hub_root, lifetime=300) as server:
        v1 = fetch(server, tmp_path / "a", "v1", lock)
        main = fetch(server, tmp_path / "b", "main", lock)
        # the lock pins main to v1's commit (as another machine fetched it): exactly that commit
        lockfile.record(lock, "dataset", ARC, "main", commit_of(ARC, "v1"))
        locked = fetch(server, tmp_path / "c", "main", lock)
    assert v1["commit"] == commit_of(ARC, "v1") and all(t.endswith(" v1") for t in v1["texts"])
    assert main["commit"] == commit_of(ARC, "main")
    assert not any(t.endswith(" v1") for t in main["texts"])
    assert locked == {**v1, "revision": "main"}


def test_the_lock_file_records_and_names_a_cache_it_disagrees_with(tmp_path: Path) -> None:
    lock = tmp_path / "hub.lock"
    assert lockfile.locked_commit(lock, "dataset", ARC, "main") is None
    lockfile.record(lock, "dataset", ARC, "main", "a" * 40)
    lockfile.record(lock, "model", "org/m", "step16", "b" * 40)
    lockfile.record(lock, "checkpoint", "org/m", "step0", "c" * 40)
    data = json.loads(lock.read_text())
    assert data["datasets"] == {ARC: {"main": "a" * 40}}
    assert data["models"] == {"org/m": {"step0": "c" * 40, "step16": "b" * 40}}
    folder, manifest = tmp_path / "data", tmp_path / "main.json"
    folder.mkdir()
    manifest.write_text(json.dumps({"commit": "a" * 40}))
    assert lockfile.stale(folder, manifest, lock, "dataset", ARC, "main") == ""
    manifest.write_text(json.dumps({"commit": "d" * 40}))
    reason = lockfile.stale(folder, manifest, lock, "dataset", ARC, "main")
    assert reason.startswith(f"the hub cache holds {ARC}@main at commit {'d' * 40}, but {lock}")
    assert f"delete {folder} and {manifest}" in reason
    lock.write_text("{not json")
    with pytest.raises(lockfile.LockError, match="is not a hub lock file"):
        lockfile.locked_commit(lock, "dataset", ARC, "main")


def test_the_card_api_gives_the_hand_parsers_file_list() -> None:
    from hub_server import ARC_CARD

    assert hub.dataset_patterns(ARC_CARD, "ARC-Challenge") == [
        "ARC-Challenge/test-*",
        "ARC-Challenge/validation-*",
    ]
    card = "---\nconfigs:\n- config_name: default\n  data_files: data/*.parquet\n---\n"
    assert hub.dataset_patterns(card, None) == ["data/*.parquet"]
    with pytest.raises(hub_cache.HubCacheError, match="no config 'default'"):
        hub.dataset_patterns("# no front matter\n", None)


PROMPTS = ["results/prompts/board.jsonl"]


def write(folder: Path, revision: str | None) -> None:
    config = json.loads(json.dumps(CONFIG))
    if revision:
        config["prompts"]["revisions"] = {"arc": revision}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.slow
def test_a_pinned_prompt_source_is_fetched_recorded_and_its_pin_reruns_the_prompts(
    hub_root: Path, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write(first, "v1")
    with LocalHub(hub_root, lifetime=600) as server:
        env = online_env(server, tmp_path / "home")
        run = snakemake(first, "--cores", "1", *PROMPTS, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        provenance = json.loads((first / "results/prompts/board.provenance.json").read_text())
        arc = provenance["hub"]["arc"]
        assert (arc["repo"], arc["revision"]) == (ARC, "v1")
        assert arc["commit"] == commit_of(ARC, "v1")
        texts = [json.loads(line)["text"] for line in open(first / PROMPTS[0])]
        assert texts and all(t.endswith(" v1") for t in texts)
        lock = json.loads((first / "hub.lock").read_text())
        assert lock["datasets"] == {ARC: {"v1": commit_of(ARC, "v1")}}
        again = snakemake(first, "-n", *PROMPTS, env=env)
        assert "Nothing to be done" in again.stdout + again.stderr
        # a changed pin re-runs the fetch and the prompts
        write(first, "main")
        dry = snakemake(first, "-n", *PROMPTS, env=env)
        text = dry.stdout + dry.stderr
        assert "rule fetch_dataset:" in text and "rule sample_prompts:" in text
        # another machine with this lock file, main pinned to v1's commit: exactly that commit
        write(second, "main")
        locked = {ARC: {"main": commit_of(ARC, "v1")}}
        (second / "hub.lock").write_text(json.dumps({"datasets": locked, "models": {}}))
        run = snakemake(second, "--cores", "1", *PROMPTS, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
    provenance = json.loads((second / "results/prompts/board.provenance.json").read_text())
    assert provenance["hub"]["arc"]["commit"] == commit_of(ARC, "v1")
    assert provenance["hub"]["arc"]["revision"] == "main"
    # a cache that disagrees with the lock stops the run before any job, in one line
    (second / "hub.lock").write_text(json.dumps({"datasets": {ARC: {"main": "e" * 40}}}))
    dry = snakemake(second, "-n", *PROMPTS)
    lines = [line for line in (dry.stdout + dry.stderr).splitlines() if line.strip()]
    assert dry.returncode != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"config error: the hub cache holds {ARC}@main at commit")
    # a lock of the wrong form stops it in one line naming the key (was a traceback)
    (second / "hub.lock").write_text(json.dumps({"models": 5}))
    dry = snakemake(second, "-n", *PROMPTS)
    lines = [line for line in (dry.stdout + dry.stderr).splitlines() if line.strip()]
    assert dry.returncode != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"config error: hub.lock_file: {'hub.lock'}: models is int 5")
    # a deleted lock is written again from the cache's manifests by the next run with a job
    # (onstart: not a dry run)
    (second / "hub.lock").unlink()
    assert snakemake(second, "-n", "-f", *PROMPTS).returncode == 0
    assert not (second / "hub.lock").exists()
    again = snakemake(second, "--cores", "1", "-f", *PROMPTS)
    assert again.returncode == 0, again.stderr[-3000:]
    recorded = lockfile.read_lock(second / "hub.lock")
    assert recorded["datasets"] == {ARC: {"main": commit_of(ARC, "v1")}}
    assert recorded["files"][commit_of(ARC, "v1")]["README.md"].startswith("git-sha1:")
