"""The fetch stage against a local hub (tests/hub_server.py on 127.0.0.1, HF_ENDPOINT): hub ids,
revision_template wildcards, snapshot_download and datasets.load_dataset through their real code
paths; compute jobs offline; checkpoint revisions deleted as their jobs finish, within
hub.max_revisions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake
from hub_server import ARC_CARD, CONFIG, MODEL, TARGETS, LocalHub, build, check_run, main_job_spec

from blockcoupling.lm.hub import cache as hub_cache
from blockcoupling.lm.hub import fetch as hub
from blockcoupling.lm.hub import revisions as hub_revisions
from blockcoupling.pipeline.entries import ModelEntry
from blockcoupling.pipeline.hub_settings import HubSettings

# .ci/slurm_test.sh sets it where a Slurm cluster is up: the hub-fault and fetch-ahead runs then
# go through the shipped profile (compute jobs by sbatch, fetch rules local) instead of --cores 1
THROUGH_SLURM = os.environ.get("BLOCKCOUPLING_TEST_THROUGH_SLURM") == "1"


def executor_args() -> list[str]:
    """How the workflow runs its jobs here: one local core, or the Slurm profile (CI's Slurm)."""
    if THROUGH_SLURM:
        profile = str(REPO / "profiles" / "slurm")
        return ["--profile", profile, "--slurm-init-seconds-before-status-checks", "2"]
    return ["--cores", "1"]


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    build(root)
    return root


# --- the planning of revisions and lanes (no server) ---------------------------------------


def entry(name: str, source: dict, steps: tuple[str, ...]) -> ModelEntry:
    return ModelEntry(name, source, steps)


def test_revisions_lanes_keep_at_most_the_bound_on_disk() -> None:
    models = {
        "a-steps": entry("a-steps", {"hub": "o/a"}, ("0", "1", "2", "3", "4")),
        "b-steps": entry("b-steps", {"hub": "o/b"}, ("0", "8")),
        "a": entry("a", {"hub": "o/a"}, ("final", "random")),
        "c": entry("c", {"hub": "o/c", "revision": "v1"}, ("final",)),
        "t": entry("t", {"train": "run"}, ("final",)),
    }
    revisions = hub_revisions.hub_revisions(models)
    kept = [(r.repo, r.revision) for r in revisions if not r.checkpoint]
    assert kept == [("o/a", "main"), ("o/c", "v1")]
    main = next(r for r in revisions if r.revision == "main")
    assert main.consumers == (("a", "final"), ("a", "random"))
    checkpoints = [r for r in revisions if r.checkpoint]
    assert len(checkpoints) == 7
    for bound in (1, 2, 3, 7, 9):
        # Simulate the scheduler: a fetch may start once its predecessor's jobs are done; jobs
        # finish in any order that respects that. On disk: fetched, jobs not yet done.
        fetched: list[hub_revisions.Revision] = []
        done: set[int] = set()
        peak = 0
        pending = list(checkpoints)
        while pending or len(done) < len(fetched):
            ready = [
                r
                for r in pending
                if (before := hub_revisions.predecessor(revisions, r, bound)) is None
                or id(before) in done
            ]
            if ready:
                fetched.append(ready[0])
                pending.remove(ready[0])
            else:  # finish the oldest revision on disk
                done.add(next(id(r) for r in fetched if id(r) not in done))
            peak = max(peak, len(fetched) - len(done))
        assert peak == min(bound, len(checkpoints))


def test_dataset_patterns_follow_the_card() -> None:
    assert hub.dataset_patterns(ARC_CARD, "ARC-Challenge") == [
        "ARC-Challenge/test-*",
        "ARC-Challenge/validation-*",
    ]
    assert hub.dataset_patterns(ARC_CARD, "ARC-Easy") == ["ARC-Easy/test-*"]
    with pytest.raises(hub_cache.HubCacheError, match="no config 'other'"):
        hub.dataset_patterns(ARC_CARD, "other")


def test_a_missing_revision_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    from blockcoupling.lm.models import load_for_job

    spec = {
        "name": "neox-steps",
        "source": {"hub": MODEL, "revision": "step16"},
        "load": {"device": "cpu"},
        "random_twin": False,
        "twin_seed": 0,
        "fetched": str(tmp_path / "checkpoints" / MODEL / "step16"),
    }
    with pytest.raises(hub_cache.HubCacheError) as error:
        load_for_job(spec)
    message = str(error.value)
    assert "\n" not in message
    assert f"models.neox-steps: revision step16 of {MODEL} is not in the hub cache" in message


@pytest.mark.slow
def test_the_workflow_fetches_then_runs_offline_within_the_revision_bound(
    hub_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    with LocalHub(hub_root, lifetime=600) as server:
        env = dict(os.environ, HF_ENDPOINT=server.endpoint, HF_HOME=str(tmp_path / "hf_home"))
        for name in hub.OFFLINE:
            env.pop(name, None)
        run = snakemake(tmp_path, "--cores", "1", *TARGETS, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    assert check_run(tmp_path, server.requests) == []


def test_schema_defaults_equal_the_hub_settings_defaults() -> None:
    from snakemake.utils import validate

    config = {"prompts": {"sets": {"s": {"file": "x.jsonl"}}}, "extract": {"prompt_set": "s"}}
    config["metrics"] = {"ks": [10]}
    validate(config, str(REPO / "schemas" / "config.schema.yaml"))
    assert HubSettings.from_section(config["hub"]) == HubSettings()
    offline = HubSettings().job_env()
    assert offline["HF_HUB_OFFLINE"] == offline["HF_DATASETS_OFFLINE"] == "1"
    assert HubSettings(offline_jobs=False).job_env() == {}


# --- hub faults in one line: an emptied or deleted revision folder, an unreachable hub -------


def blockcoupling(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    for name in hub.OFFLINE:
        environ.pop(name, None)
    command = [sys.executable, "-m", "blockcoupling.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environ, timeout=300)


def test_a_revision_counts_as_fetched_when_its_manifest_files_are_there(
    hub_root: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "cache" / "checkpoints" / MODEL / "step16"
    with LocalHub(hub_root) as server:
        done = blockcoupling("fetch", MODEL, "step16", str(folder), HF_ENDPOINT=server.endpoint)
    assert done.returncode == 0, done.stderr
    manifest = tmp_path / "cache" / "manifests" / "checkpoint" / MODEL / "step16.json"
    assert hub_cache.manifest_of(folder) == manifest
    assert hub_cache.missing_files(folder) == []
    assert hub_cache.require(folder, "models.neox-steps", MODEL, "step16") == folder
    # emptied as Snakemake leaves a directory output: only its timestamp file
    for path in folder.iterdir():
        path.unlink()
    (folder / ".snakemake_timestamp").touch()
    listed = sorted(json.loads(manifest.read_text())["files"])
    assert hub_cache.missing_files(folder) == listed
    with pytest.raises(hub_cache.HubCacheError) as error:
        hub_cache.require(folder, "models.neox-steps", MODEL, "step16")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"models.neox-steps: revision step16 of {MODEL} is incomplete in the hub cache "
        f"({len(listed)} files missing"
    )
    assert f"blockcoupling fetch {MODEL} step16 {folder}" in message
    with pytest.raises(ValueError, match="not the folder of"):
        from blockcoupling.cli import fetch_revision

        fetch_revision(MODEL, "step16", tmp_path / "elsewhere")


def test_a_fetched_file_damaged_at_its_size_stops_the_job_naming_it(
    hub_root: Path, tmp_path: Path
) -> None:
    """The hub's own hashes (LFS SHA-256 of the weights, git blob ids of the rest) are recorded
    at fetch time; one bit flipped in the weights stops the job before it loads them."""
    import hashlib

    from blockcoupling.lm.models import load_for_job

    folder = tmp_path / "cache" / "models" / MODEL / "main"
    with LocalHub(hub_root) as server:
        done = blockcoupling("fetch", MODEL, "main", str(folder), HF_ENDPOINT=server.endpoint)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(hub_cache.manifest_of(folder).read_text())
    weights = folder / "model.safetensors"
    assert sorted(manifest["hashes"]) == sorted(manifest["files"])
    assert manifest["hashes"]["model.safetensors"] == (
        f"sha256:{hashlib.sha256(weights.read_bytes()).hexdigest()}"
    )
    assert manifest["hashes"]["config.json"].startswith("git-sha1:")
    assert hub_cache.damaged_files(folder) == []
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight: the size is the same
    weights.write_bytes(bytes(data))
    assert hub_cache.missing_files(folder) == []  # sizes alone cannot see it
    assert hub_cache.damaged_files(folder) == ["model.safetensors"]
    spec = main_job_spec(folder)
    with pytest.raises(hub_cache.HubCacheError) as error:
        load_for_job(spec)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"models.neox: {weights} differs from the hash the hub gave it")
    assert f"rm -r {folder}, then blockcoupling fetch {MODEL} main {folder}" in message


def test_a_pinned_commit_the_hub_lacks_names_the_lock_file(hub_root: Path, tmp_path: Path) -> None:
    """The fetch rule asks for the lock's commit: a hub that refuses it is named with the lock,
    not as refusing "revision main"."""
    lock = tmp_path / "hub.lock"
    folder = tmp_path / "cache" / "models" / MODEL / "main"
    code = (
        "import sys; from blockcoupling.lm import hub; hub.go_online(); "
        f"hub.fetch_model({MODEL!r}, 'main', {str(folder)!r}, 'f' * 40, {str(lock)!r})"
    )
    with LocalHub(hub_root) as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "blockcoupling.lm.hub.cache.HubCacheError: "
        f"the hub at {server.endpoint} refused {MODEL} at "
        f"commit {'f' * 40}, which {lock} pins for revision main ("
    ), done.stderr[-2000:]
    assert "delete its entry" in last


def test_an_unreachable_hub_is_one_line_naming_endpoint_repo_and_revision(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    folder = tmp_path / "cache" / "models" / MODEL / "main"
    done = blockcoupling("fetch", MODEL, "main", str(folder), HF_ENDPOINT=endpoint)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"blockcoupling fetch: cannot reach the hub at {endpoint} to fetch {MODEL} at revision "
        "main ("
    )
    assert "check this machine's network" in lines[0] and "HF_ENDPOINT" in lines[0]


def test_a_hub_down_line_names_the_model_keys_and_the_fetch_command(tmp_path: Path) -> None:
    """A fetch rule that cannot reach the hub (a deleted revision, the hub down) names the
    config keys that need the revision and the command that fetches exactly it, as the
    emptied-folder line does; `blockcoupling fetch` itself (no keys) keeps its short line."""
    from blockcoupling.lm.hub import fetch as hub

    class TransportError(Exception):  # httpx's, by name (hub.UNREACHABLE)
        pass

    folder = tmp_path / "cache" / "models" / MODEL / "main"
    error = TransportError("[Errno 111] Connection refused")
    line = str(hub.hub_fault(error, MODEL, "main", None, "models.neox", folder))
    assert line.startswith(f"models.neox: cannot reach the hub at {hub.endpoint()} to fetch ")
    assert line.endswith(
        f"or fetch exactly it where the network is: blockcoupling fetch {MODEL} main {folder}"
    )
    assert "\n" not in line
    plain = str(hub.hub_fault(error, MODEL, "main"))
    assert plain.startswith("cannot reach the hub") and "blockcoupling fetch" not in plain


@pytest.mark.slow
def test_an_emptied_or_deleted_revision_stops_the_workflow_in_one_line(
    hub_root: Path, tmp_path: Path
) -> None:
    """The main revision fetched, then emptied (Snakemake's timestamp left): the dry run stops
    in one line; deleted with the hub stopped: the fetch rule (local: never retried on Slurm)
    fails in one line naming the endpoint."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    folder = tmp_path / "cache" / "models" / MODEL / "main"
    command = ["--nolock", *executor_args()]
    with LocalHub(hub_root) as server:
        env = dict(os.environ, HF_ENDPOINT=server.endpoint, HF_HOME=str(tmp_path / "hf_home"))
        for name in hub.OFFLINE:
            env.pop(name, None)
        run = snakemake(tmp_path, *command, "fetch", env=env, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    for path in folder.iterdir():
        path.unlink()
    (folder / ".snakemake_timestamp").touch()
    target = "results/extract/neox/final/depth.nc"
    emptied = snakemake(tmp_path, *command, "-n", target, env=env, timeout=300)
    assert emptied.returncode == 1
    assert (
        emptied.stderr.strip()
        .splitlines()[-1]
        .startswith(f"models.neox: revision main of {MODEL} is incomplete in the hub cache")
    ), emptied.stderr[-2000:]
    assert "Traceback" not in emptied.stderr
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    deleted = snakemake(tmp_path, *command, "fetch", env=env, timeout=300)
    assert deleted.returncode == 1
    errors = [line for line in deleted.stderr.splitlines() if "cannot reach the hub" in line]
    assert errors and errors[0].split(" ERROR ")[-1].startswith(
        f"fetch_model: models.neox: cannot reach the hub at {server.endpoint} to fetch {MODEL} "
        "at revision main"
    ), deleted.stderr[-3000:]
    assert errors[0].endswith(f"blockcoupling fetch {MODEL} main {folder}")
    assert (
        "Traceback" not in deleted.stderr
        and "ConnectError:" not in deleted.stderr.split("cannot reach")[0]
    )


@pytest.mark.slow
def test_fetch_ahead_then_the_run_needs_no_hub(hub_root: Path, tmp_path: Path) -> None:
    """hub.max_revisions: all: `fetch` says the disk first and fetches every revision, checkpoints
    too; with the hub stopped, the checkpoints' jobs then run and keep them."""
    import time

    config = {**CONFIG, "hub": {"cache_dir": "cache", "max_revisions": "all"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    command = ["--nolock", *executor_args()]
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"))
    for name in hub.OFFLINE:
        env.pop(name, None)
    with LocalHub(hub_root) as server:
        env["HF_ENDPOINT"] = server.endpoint
        start = time.monotonic()
        fetch = snakemake(tmp_path, *command, "fetch", env=env, timeout=600)
        seconds = time.monotonic() - start
    assert fetch.returncode == 0, fetch.stderr[-3000:]
    said = [line for line in fetch.stderr.splitlines() if line.startswith("hub: max_revisions")]
    assert said and "3 model revisions and the datasets" in said[0], fetch.stderr[-2000:]
    assert fetch.stderr.index(said[0]) < fetch.stderr.index("rule fetch_")  # before any fetch
    print(f"fetch ahead: {said[0]} ({seconds:.1f} s)")
    cache = tmp_path / "cache"
    for step in ("step0", "step16"):
        assert hub_cache.missing_files(cache / "checkpoints" / MODEL / step) == []
    fetched = len(server.requests)
    # the hub is stopped: the checkpoint revisions' jobs run offline and keep them (the main
    # revision's job runs offline in test_the_workflow_fetches_then_runs_offline_within_...)
    steps = [target for target in TARGETS if "/neox-steps/" in target]
    assert len(steps) == 2
    run = snakemake(tmp_path, *command, *steps, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "rule fetch_" not in run.stdout + run.stderr  # nothing fetched again
    if THROUGH_SLURM:  # every compute job went through sbatch, with no hub to reach
        assert "submitted with SLURM jobid" in run.stdout + run.stderr, run.stderr[-2000:]
    assert len(server.requests) == fetched
    for step in ("step0", "step16"):  # kept: nothing to fetch again
        assert hub_cache.missing_files(cache / "checkpoints" / MODEL / step) == []
    assert hub_cache.checkpoints_on_disk(cache) == 2
