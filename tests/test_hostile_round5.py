"""The fifth round of hostile inputs and faults (issue 42): a fetch that could delete outside its
folder, ``verify`` fooled by symlinks, planted files and deleted records, fetched weights
checked by content, values that passed the checks and failed late, the lock file, one-line
errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockcoupling import cli
from blockcoupling.lm import hub
from blockcoupling.lm.hub_names import HubNameError, check_fetch_folder

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
