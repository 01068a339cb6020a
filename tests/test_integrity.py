"""Integrity under hostile inputs and faults: a fetch that could delete outside its folder,
``verify`` fooled by symlinks, planted files and deleted records, fetched weights checked by
content, values that passed the checks and failed late, the lock file, one-line errors."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, SCHEMA, save_tiny_folder

from blockcoupling import cli
from blockcoupling.files import manifest, run_record
from blockcoupling.lm.hub import content
from blockcoupling.lm.hub import fetch as hub
from blockcoupling.lm.hub import lock as lockfile
from blockcoupling.lm.hub.names import HubNameError, check_fetch_folder
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.schema_check import validate_config
from blockcoupling.pipeline.slurm_nodes import minutes

MODEL = "tiny-org/neox"


def one_line_error(capsys: pytest.CaptureFixture, argv: list[str], code: int = 2) -> str:
    """The one stderr line of ``blockcoupling ARGV`` (exit status ``code``)."""
    assert cli.main(argv) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- a fetch deletes nothing outside its folder ----------------------------------------------


@pytest.fixture
def victim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Another model's folder in the hub cache of ``tmp_path`` (the working directory)."""
    monkeypatch.chdir(tmp_path)
    for name in hub.OFFLINE:  # the fetch command runs in this process, huggingface_hub imported
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "cache" / "models" / "tiny-org" / "victim"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


@pytest.mark.parametrize(
    ("repo", "revision", "folder"),
    [
        (MODEL, "..", f"cache/models/{MODEL}/.."),
        ("neox", "..", "cache/models/neox/.."),
        (MODEL, ".", f"cache/models/{MODEL}/."),
        ("tiny-org/..", "main", "cache/models/tiny-org/../main"),
    ],
)
def test_fetch_refuses_a_folder_that_leads_out_and_deletes_nothing(
    victim: Path, capsys: pytest.CaptureFixture, repo: str, revision: str, folder: str
) -> None:
    line = one_line_error(capsys, ["fetch", repo, revision, folder])
    assert line.startswith("blockcoupling fetch: hub ") and "is not a" in line  # id or revision
    assert (victim / "model.safetensors").read_bytes() == b"weights"
    with pytest.raises(HubNameError):  # the workflow's fetch rules go through the same check
        hub.fetch_model(repo, revision, folder)
    assert (victim / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize(
    ("repo", "link"), [(MODEL, f"cache/models/{MODEL}/main"), ("evil/neox", "cache/models/evil")]
)
def test_fetch_refuses_a_symlinked_folder_and_leaves_its_target(
    victim: Path, tmp_path: Path, capsys: pytest.CaptureFixture, repo: str, link: str
) -> None:
    outside = tmp_path / "outside"
    (outside / "neox" / "main").mkdir(parents=True)
    (outside / "neox" / "main" / "keep").write_text("mine")
    (outside / "keep").write_text("mine")
    Path(link).parent.mkdir(parents=True, exist_ok=True)
    Path(link).symlink_to(outside)
    line = one_line_error(capsys, ["fetch", repo, "main", f"cache/models/{repo}/main"])
    assert "is a symlink" in line and "remove the link" in line
    with pytest.raises(HubNameError, match="is a symlink"):
        hub.fetch_model(repo, "main", f"cache/models/{repo}/main")
    assert (outside / "keep").read_text() == (outside / "neox" / "main" / "keep").read_text()


def test_a_symlinked_cache_dir_is_fine(tmp_path: Path) -> None:
    """The cache itself may live elsewhere (hub_cache -> /scratch/...): only the parts below it
    must be plain folders."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "scratch")
    folder = tmp_path / "cache" / "models" / MODEL / "main"
    cache, kind, resolved = check_fetch_folder(folder, MODEL, "main")
    assert (cache, kind) == (tmp_path / "cache", "model")
    assert resolved == tmp_path / "scratch" / "models" / MODEL / "main"


# --- verify over the whole run ---------------------------------------------------------------


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A results folder as jobs leave it: two CSV tables, a directory output, a trainer's
    checkpoint and work folder; every result recorded."""
    root = tmp_path / "results"
    names = ("stats/a.csv", "stats/b.csv", "models/m/converted/config.json", "train/r/step4/c.json")
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x,y\n1,2\n" if name.endswith(".csv") else "{}")
    manifest.record([root / "stats" / "a.csv", root / "stats" / "b.csv"])
    manifest.record([root / "models" / "m" / "converted", root / "train" / "r" / "step4"])
    work = root / "train" / "r" / "work-0123456789ab"
    work.mkdir(parents=True)
    (work / "state.pt").write_bytes(b"resume state")
    assert manifest.verify(root) == []
    return root


def test_verify_names_a_recorded_folder_replaced_by_a_symlink_to_a_modified_copy(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run / "stats", copy)
    (copy / "a.csv").write_text("x,y\n1,3\n")
    shutil.rmtree(run / "stats")
    (run / "stats").symlink_to(copy)
    assert manifest.verify(run) == [
        f"{run / 'stats'}: a symlink (to {copy}), not a result its job wrote; delete the link and "
        "rerun the workflow"
    ]
    assert cli.main(["verify", str(run)]) == 1
    assert "a symlink" in capsys.readouterr().out


def test_verify_names_a_planted_symlink_and_planted_files(run: Path) -> None:
    (run / "figures").mkdir()
    (run / "figures" / "etc").symlink_to("/etc")
    (run / "stats" / "work-evil").mkdir()
    (run / "stats" / "work-evil" / "x.csv").write_text("x\n1\n")
    (run / "stats" / ".manifest").mkdir()
    (run / "stats" / ".manifest" / "y.json").write_text("{}")
    problems = manifest.verify(run)
    assert problems == [
        f"{run / 'figures' / 'etc'}: a symlink (to /etc), not a result its job wrote; delete the "
        "link and rerun the workflow",
        f"{run / 'stats' / '.manifest' / 'y.json'}: no record in .manifest (not written by a "
        "workflow job)",
        f"{run / 'stats' / 'work-evil' / 'x.csv'}: no record in .manifest (not written by a "
        "workflow job)",
    ]


def test_verify_names_a_symlinked_record(run: Path, tmp_path: Path) -> None:
    forged = tmp_path / "forged.json"
    record = run / ".manifest" / "stats" / "a.csv.json"
    forged.write_text(record.read_text())
    record.unlink()
    record.symlink_to(forged)
    assert manifest.verify(run) == [
        f"{record}: a symlink (to {forged}), not a result its job wrote; delete the link and "
        "rerun the workflow"
    ]


def test_verify_sees_a_file_deleted_together_with_its_record(run: Path) -> None:
    (run / "stats" / "b.csv").unlink()
    (run / ".manifest" / "stats" / "b.csv.json").unlink()
    assert manifest.verify(run) == [
        f"{run / 'stats' / 'b.csv'}: in the run record, but the file and its record are gone "
        "(deleted together); rerun the workflow"
    ]


def test_verify_sees_a_file_planted_with_a_record_by_hand(run: Path) -> None:
    planted = run / "stats" / "c.csv"
    planted.write_text("x\n1\n")
    entry = {"sha256": manifest.sha256(planted), "size": planted.stat().st_size}
    (run / ".manifest" / "stats" / "c.csv.json").write_text(json.dumps(entry))
    [line] = manifest.verify(run)
    assert line.startswith(f"{planted}: has a record but is not in the run record")


@pytest.mark.parametrize("text", ["garbage", '{"sha256": "00"}', "[]"])
def test_verify_names_an_unreadable_record_in_one_line(
    run: Path, capsys: pytest.CaptureFixture, text: str
) -> None:
    record = run / ".manifest" / "stats" / "a.csv.json"
    record.write_text(text)
    assert manifest.verify(run) == [
        f"{record}: not a record of {run / 'stats' / 'a.csv'} (no JSON with its sha256 and size); "
        "delete both and rerun the workflow"
    ]
    assert cli.main(["verify", str(run)]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("text", ["garbage", '{"files": {}, "sha256": "0"}', ""])
def test_verify_names_a_run_record_that_does_not_read_or_was_edited(run: Path, text: str) -> None:
    where = run / ".manifest" / ".run"
    where.write_text(text)
    [line] = manifest.verify(run)
    assert line.startswith(f"{where}: ") and "cannot be trusted" in line
    where.unlink()
    [line] = manifest.verify(run)
    assert line.startswith(f"{where}: no run record")


def test_a_results_folder_from_before_the_run_record_is_adopted_by_its_next_job(run: Path) -> None:
    """Adopted, and said: verify names a run record started from the per-file records."""
    from blockcoupling.files import seal_key

    (run / ".manifest" / ".run").unlink()
    (run / "stats" / "d.csv").write_text("x\n1\n")
    manifest.record([run / "stats" / "d.csv"])
    [line] = manifest.verify(run)
    assert "started anew from the per-file records" in line
    listed = run_record.read(run / ".manifest" / ".run", seal_key.load())
    assert listed is not None and sorted(listed.files) == [
        "models/m/converted/config.json",
        "stats/a.csv",
        "stats/b.csv",
        "stats/d.csv",
        "train/r/step4/c.json",
    ]


def test_a_directory_output_written_anew_replaces_its_run_record_entries(run: Path) -> None:
    folder = run / "models" / "m" / "converted"
    (folder / "config.json").unlink()
    (folder / "model.json").write_text("{}")
    manifest.record([folder])
    assert manifest.verify(run) == []


# --- planner inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["-5", "-1-00:00:00", "0", "0:00", "1:-5", "5m", "1-"])
def test_plan_refuses_a_time_limit_that_is_not_positive_naming_the_flag(
    capsys: pytest.CaptureFixture, limit: str
) -> None:
    line = one_line_error(capsys, ["plan", "--configfile", "any.yaml", f"--time-limit={limit}"])
    assert line.startswith(f"blockcoupling plan: --time-limit {limit!r}: time limit")
    assert "give a positive limit" in line
    with pytest.raises(ValueError, match="time limit"):
        minutes(limit)


@pytest.mark.parametrize(
    ("limit", "value"), [("5", 5), ("1:30:00", 90), ("1-00:00:00", 1440), ("infinite", None)]
)
def test_valid_time_limits_still_read(limit: str, value: int | None) -> None:
    assert minutes(limit) == value


def test_plan_csv_that_is_a_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    line = one_line_error(capsys, ["plan", "--configfile", "any.yaml", "--csv", str(tmp_path)])
    assert line == (
        f"blockcoupling plan: --csv {tmp_path}: is a folder; name a CSV file, e.g. --csv plan.csv"
    )


# --- the lock file ---------------------------------------------------------------------------

ARC = "allenai/ai2_arc"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"models": 5}', "models is int 5, not a mapping"),
        ('{"models": {"org/m": {"main": "abc"}}}', "models.org/m is not a mapping"),
        ('{"datasets": []}', "datasets is list"),
        ('{"files": {"c": {"x": "md5:00"}}}', "files.c is not a mapping"),
        ('{"model": {}}', "unknown key 'model'"),
        ("[1]", "not a JSON object"),
        ("\xff\xfe", "is not a hub lock file"),
    ],
)
def test_a_lock_file_of_the_wrong_form_is_one_line_naming_it_and_the_key(
    tmp_path: Path, text: str, names: str
) -> None:
    lock = tmp_path / "hub.lock"
    lock.write_bytes(text.encode("latin-1"))
    for call in (
        lambda: lockfile.locked_commit(lock, "model", "org/m", "main"),
        lambda: lockfile.stale(tmp_path, tmp_path / "m.json", lock, "model", "org/m", "main"),
        lambda: lockfile.record(lock, "model", "org/m", "main", "a" * 40),
    ):
        with pytest.raises(lockfile.LockError) as error:
            call()
        message = str(error.value)
        assert "\n" not in message and str(lock) in message and names in message
        assert "restore it from version control" in message


def test_a_lock_path_that_is_a_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(lockfile.LockError, match="is a folder, not a hub lock file: set hub"):
        lockfile.locked_commit(tmp_path, "model", "org/m", "main")


def test_a_read_only_lock_is_refused_untouched_and_kept_when_nothing_changes(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "hub.lock"
    lockfile.record(lock, "model", "org/m", "main", "a" * 40)
    lock.chmod(0o444)
    text = lock.read_text()
    lockfile.record(lock, "model", "org/m", "main", "a" * 40)  # already there: no write
    with pytest.raises(lockfile.LockError, match=r"is read-only.*chmod u\+w"):
        lockfile.record(lock, "model", "org/m", "v2", "b" * 40)
    assert lock.read_text() == text and stat.S_IMODE(lock.stat().st_mode) == 0o444


def test_a_symlinked_lock_keeps_its_link_and_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "shared" / "hub.lock"
    target.parent.mkdir()
    lockfile.record(target, "model", "org/m", "main", "a" * 40)
    target.chmod(0o640)
    link = tmp_path / "hub.lock"
    link.symlink_to(target)
    lockfile.record(link, "model", "org/m", "v2", "b" * 40, {"config.json": "git-sha1:" + "c" * 40})
    assert link.is_symlink() and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert lockfile.locked_commit(target, "model", "org/m", "v2") == "b" * 40
    assert lockfile.read_lock(link)["files"] == {"b" * 40: {"config.json": "git-sha1:" + "c" * 40}}


def test_a_deleted_lock_is_recorded_again_from_the_caches_manifests(tmp_path: Path) -> None:
    lock, manifest_file = tmp_path / "hub.lock", tmp_path / "main.json"
    hashes = {"model.safetensors": "sha256:" + "d" * 64}
    manifest_file.write_text(json.dumps({"commit": "a" * 40, "hashes": hashes}))
    lockfile.adopt(lock, "model", "org/m", "main", manifest_file)
    assert lockfile.locked_commit(lock, "model", "org/m", "main") == "a" * 40
    assert lockfile.read_lock(lock)["files"]["a" * 40] == hashes
    lockfile.record(lock, "model", "org/m", "main", "b" * 40)  # the lock's pin wins from now on
    lockfile.adopt(lock, "model", "org/m", "main", manifest_file)
    assert lockfile.locked_commit(lock, "model", "org/m", "main") == "b" * 40


def test_a_manifest_whose_hashes_disagree_with_the_lock_stops_the_run(tmp_path: Path) -> None:
    lock, folder, manifest_file = tmp_path / "hub.lock", tmp_path / "main", tmp_path / "main.json"
    folder.mkdir()
    lockfile.record(lock, "model", "org/m", "main", "a" * 40, {"w": "sha256:" + "1" * 64})
    manifest_file.write_text(
        json.dumps({"commit": "a" * 40, "hashes": {"w": "sha256:" + "1" * 64}})
    )
    assert lockfile.stale(folder, manifest_file, lock, "model", "org/m", "main") == ""
    manifest_file.write_text(
        json.dumps({"commit": "a" * 40, "hashes": {"w": "sha256:" + "2" * 64}})
    )
    reason = lockfile.stale(folder, manifest_file, lock, "model", "org/m", "main")
    assert reason.startswith(f"{manifest_file} lists other content hashes for org/m@main")
    assert f"delete {folder} and {manifest_file}" in reason
    with pytest.raises(lockfile.LockError, match="with other content than"):  # a changing proxy
        lockfile.record(lock, "model", "org/m", "main", "a" * 40, {"w": "sha256:" + "2" * 64})
    manifest_file.write_text("garbage")
    reason = lockfile.stale(folder, manifest_file, lock, "model", "org/m", "main")
    assert reason.startswith(f"{manifest_file}, the manifest of the fetch of org/m@main, does not")


def test_a_download_that_differs_from_the_hubs_hash_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_bytes(b"{}")
    (tmp_path / "extra.txt").write_bytes(b"x")
    right = content.file_hash(tmp_path / "w.safetensors")
    siblings = [
        SimpleNamespace(rfilename="w.safetensors", lfs={"sha256": right[7:]}, blob_id="0" * 40),
        SimpleNamespace(rfilename="config.json", lfs=None, blob_id="0" * 40),
        SimpleNamespace(rfilename="extra.txt", lfs=None, blob_id=None),
    ]
    names = ["w.safetensors", "config.json", "extra.txt"]
    hashes, differing = content.fetched_hashes(tmp_path, names, siblings)
    assert differing == ["config.json"]  # its git blob id is not 00..0
    assert hashes == {
        "extra.txt": content.file_hash(tmp_path / "extra.txt"),
        "w.safetensors": right,
    }
    blob = content.file_hash(tmp_path / "config.json", "git-sha1")
    assert blob == "git-sha1:9e26dfeeb6e641a33dae4961196235bdb965b21b"  # git hash-object of "{}"


@pytest.mark.parametrize(
    ("value", "said"),
    [(0, "0 is less than the minimum of 1"), (-3, "-3 is less than the minimum of 1")],
)
def test_max_revisions_out_of_range_names_the_bound(value: object, said: str) -> None:
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config["hub"] = {"max_revisions": value}
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
    assert str(error.value).startswith(f"hub.max_revisions: {said}")


@pytest.mark.parametrize("value", [1, 4, "all"])
def test_max_revisions_valid_values_pass(value: object) -> None:
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config["hub"] = {"max_revisions": value}
    validate_config(config, SCHEMA)


# --- values that passed the checks and failed late ------------------------------------------


def smoke_config() -> dict:
    return yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def refused(config: dict) -> str:
    """The one-line ConfigError of the schema or check_config for ``config``."""
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
        check_config(config, REPO)
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("stats", "seed", -1),
        ("stats", "seed", 2**70),
        ("prompts", "seed", -1),
        ("metrics", "null_seed", 2**64),
    ],
)
def test_a_seed_out_of_range_is_refused_by_the_schema(section: str, key: str, value: int) -> None:
    config = smoke_config()
    config[section] = {**config.get(section, {}), key: value}
    assert refused(config).startswith(f"{section}.{key}: {value} is ")


@pytest.mark.parametrize("seed", [2**70, -1])
def test_a_train_grid_seed_out_of_range_is_refused_before_the_train_job(seed: int) -> None:
    config = smoke_config()
    config["train"]["grids"]["emergence"]["axes"]["seed"] = [seed]
    message = refused(config)
    assert message.startswith("train.grids.emergence (run emergence-s")
    assert "seed must be in 0..2**63-1" in message


def test_a_model_name_too_long_for_a_file_name_is_refused(tmp_path: Path) -> None:
    config = smoke_config()
    name = "m" * 300
    config["models"] = {name: {"source": {"package": "blockcoupling_tinygguf", "assemble": True}}}
    message = refused(config)
    assert message.startswith(f"model {'m' * 40!r}... has 300 bytes") and "at most 100" in message


# --- model folders: one line, never a model's code ------------------------------------------


def test_an_auto_map_given_as_a_list_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = save_tiny_folder(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = [{"AutoModel": "evil.X"}, {"AutoConfig": "evil.C"}]  # unsortable
    (folder / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    line = one_line_error(capsys, ["measure", str(folder), "hello", "--k", "2"])
    assert "has auto_map (custom model code, [{" in line


def test_a_malicious_pytorch_bin_is_refused_in_one_line_and_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import os
    import pickle

    folder = save_tiny_folder(tmp_path / "m")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    capsys.readouterr()
    line = one_line_error(capsys, ["measure", str(folder), "hello", "--k", "2"])
    assert "weights_only=True refused" in line and "use the model's .safetensors" in line
    assert not marker.exists()


def test_an_emptied_local_model_folder_is_named_at_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    line = one_line_error(capsys, ["measure", str(folder), "hello"])
    assert line == (
        f"blockcoupling measure: model folder {str(folder)!r} is empty: give the folder a model "
        "was saved to (save_pretrained: config.json, weights, tokenizer), or its .gguf file"
    )
    config = smoke_config()
    config["models"] = {"local": {"source": {"path": str(folder)}}}
    assert refused(config).startswith(f"models.local.source: model folder {str(folder)!r} is empty")


# --- claims and docs: one line with the fix ------------------------------------------------


def test_docs_and_claims_name_a_folder_a_missing_file_and_non_utf8_text(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from blockcoupling.coupling.registry import DOCS_START

    line = one_line_error(capsys, ["docs", str(tmp_path)])
    assert line == f"blockcoupling docs: {tmp_path} is a folder: name the file that holds the " + (
        f"markers {DOCS_START}"
    )
    results = tmp_path / "results"
    (results / "stats").mkdir(parents=True)
    (results / "stats" / "claims.md").write_text("claims\n")
    missing = tmp_path / "missing.md"
    line = one_line_error(capsys, ["claims", str(results), "--readme", str(missing)])
    assert line.startswith(f"blockcoupling claims: {missing} does not exist: name the file")
    latin = tmp_path / "README.md"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    line = one_line_error(capsys, ["claims", str(results), "--readme", str(latin)])
    assert line == (
        f"blockcoupling claims: {latin} is not UTF-8 text (byte 3): re-save it as UTF-8"
    )


def test_a_converted_gguf_follows_the_umask(tmp_path: Path) -> None:
    import os

    from blockcoupling.lm.models import convert_gguf
    from blockcoupling.lm.sources import parse_source
    from blockcoupling_tinygguf import assemble

    gguf = assemble(tmp_path / "a.gguf")
    previous = os.umask(0o022)
    try:
        folder = convert_gguf(parse_source({"path": str(gguf)}), tmp_path / "converted")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


RULE_COPYING_ONTO_A_FULL_DISK = """
import shutil, sys
from pathlib import Path
from types import SimpleNamespace
from blockcoupling.runtime.runner import run_script
work = Path(sys.argv[1])
(work / "step4").mkdir(parents=True)
for name in ("model.safetensors", "config.json"):
    (work / "step4" / name).write_text("x")
def onto_full_disk(source, target):
    shutil.copyfile(source, "/dev/full")
def main(sm):  # the train rule publishing a checkpoint folder on a full disk
    shutil.copytree(work / "step4", work / "published", copy_function=onto_full_disk)
sm = SimpleNamespace(log=[], output=[], rule="train_r", threads=1, params=SimpleNamespace())
run_script(sm, main)
"""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (ENOSPC on write)")
def test_a_full_disk_while_publishing_checkpoints_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", RULE_COPYING_ONTO_A_FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-3000:]
    assert f" ERROR train_r: writing {tmp_path / 'published'}/" in lines[0]
    assert lines[0].endswith(": the disk is full (No space left on device); free space and rerun")


# --- a second run beside a running one ------------------------------------------------------


def running_state(folder: Path) -> None:
    """The Snakemake state of a run under way in ``folder``: its locks, an incomplete output."""
    (folder / ".snakemake" / "locks").mkdir(parents=True)
    (folder / ".snakemake" / "locks" / "0.output.lock").write_text("results/a.nc\n")
    (folder / ".snakemake" / "incomplete").mkdir()
    (folder / ".snakemake" / "incomplete" / "cmVzdWx0cy9hLm5j").write_text("")


def test_a_second_run_beside_a_running_one_is_told_to_wait(tmp_path: Path) -> None:
    from conftest import snakemake

    from blockcoupling.pipeline.running import another_run

    assert another_run(tmp_path, []) is None
    running_state(tmp_path)
    assert another_run(tmp_path, ["--unlock"]) is None
    assert another_run(tmp_path, ["--rerun-incomplete"]) is None
    (tmp_path / "config.yaml").write_text((REPO / "config" / "smoke.yaml").read_text())
    dry = snakemake(tmp_path, "-n", timeout=300)
    lines = [line for line in dry.stderr.splitlines() if line.strip()]
    assert dry.returncode == 1 and len(lines) == 1, dry.stderr[-2000:]
    assert lines[0].startswith(f"snakemake: another Snakemake run is under way in {tmp_path}")
    assert "wait for it to end" in lines[0] and "snakemake --unlock" in lines[0]


def test_check_config_reads_the_lock_file_as_a_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    config = smoke_config()
    config["models"] = {"neox": {"source": {"hub": MODEL}, "meta": {"n_layers": 2, "d_model": 16}}}
    config["figures"] = {}
    config["hub"] = {"lock_file": "hub.lock"}
    Path("hub.lock").write_text('{"models": 5}')
    assert refused(config).startswith("hub.lock_file: hub.lock: models is int 5, not a mapping")
    Path("c.yaml").write_text(yaml.safe_dump(config))
    line = one_line_error(
        capsys, ["check-config", "--configfile", "c.yaml", "--workflow-dir", str(REPO)]
    )
    assert "hub.lock_file: hub.lock: models is int 5" in line


def test_recording_a_deleted_lock_names_a_read_only_one_instead_of_failing(tmp_path: Path) -> None:
    lock, folder, manifest_file = tmp_path / "hub.lock", tmp_path / "main", tmp_path / "main.json"
    folder.mkdir()
    manifest_file.write_text(json.dumps({"commit": "a" * 40}))
    fetched = [("model", "org/m", "main", str(folder), str(manifest_file))]
    assert lockfile.adopt_all(lock, fetched) == []
    assert lockfile.locked_commit(lock, "model", "org/m", "main") == "a" * 40
    lock.write_text("{}")
    lock.chmod(0o444)
    [line] = lockfile.adopt_all(lock, fetched)
    assert line.startswith(f"hub.lock_file: {lock} is read-only")


def test_read_utf8_reads_newlines_as_read_text_does(tmp_path) -> None:
    """A CRLF file's block rewrite must not mix line endings: read_utf8 gives '\\n' as
    read_text does (a bytes decode kept '\\r\\n'), and names the first byte that is not UTF-8."""
    from blockcoupling.files.io import read_utf8

    crlf = tmp_path / "crlf.md"
    crlf.write_bytes(b"a\r\nb\r\n")
    assert read_utf8(crlf) == "a\nb\n"
    latin = tmp_path / "latin.md"
    latin.write_bytes(b"ab\xe9")
    with pytest.raises(ValueError, match=r"^README is not UTF-8 text \(byte 2\): re-save it"):
        read_utf8(latin, "README")
