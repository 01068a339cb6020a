"""Hub ids, revisions and package files the hub or the filesystem would refuse (they become cache
folders): refused at check-config, real ones pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import refusal, with_model

from blockcoupling import cli
from blockcoupling.lm.hub.names import HubNameError, check_repo_id, check_revision, contained
from blockcoupling.lm.sources import ModelSourceError, parse_source, resolve

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- hub ids, revisions, contained paths ---------------------------------------------------


@pytest.mark.parametrize("repo", ["../..", "..", "org/..", "a..b", "/etc", "a/b/c", "x--y"])
def test_hub_ids_the_hub_refuses_are_refused(repo: str) -> None:
    with pytest.raises(HubNameError):
        check_repo_id(repo)
    assert "hub" in refusal(with_model({"hub": repo}))


@pytest.mark.parametrize("repo", ["gpt2", "EleutherAI/pythia-70m", "HuggingFaceTB/SmolLM2-135M"])
def test_real_hub_ids_pass(repo: str) -> None:
    assert check_repo_id(repo) == repo


@pytest.mark.parametrize(
    "revision", ["..", "../../x", "victim/..", "/abs", "a//b", ".hidden", "x.lock", "a b", "x/"]
)
def test_revisions_that_escape_or_git_refuses_are_refused_at_check_config(revision: str) -> None:
    with pytest.raises(HubNameError):
        check_revision(revision)
    message = refusal(with_model({"hub": "org/x", "revision": revision}))
    assert "models.evil.source" in message and "hub revision" in message


@pytest.mark.parametrize("revision", ["main", "step1000", "refs/pr/1", "v1.0", "a" * 40])
def test_real_revisions_pass(revision: str) -> None:
    assert check_revision(revision) == revision


def test_a_revision_with_a_slash_is_refused_by_the_workflow_not_missing_input() -> None:
    message = refusal(with_model({"hub": "org/x", "revision": "refs/pr/1"}))
    assert "refs/pr/1" in message and "commit hash" in message


def test_a_revision_template_that_escapes_is_refused() -> None:
    config = with_model({"hub": "org/x"}, steps=[1], revision_template="../../{step}")
    assert "hub revision '../../1'" in refusal(config)


def test_a_hub_source_with_an_unknown_key_is_refused_before_any_download() -> None:
    with pytest.raises(ModelSourceError, match="unknown key.*evil"):
        parse_source({"hub": "gpt2", "evil": 1})
    # the command line's YAML form: one line, no retries against the hub
    assert cli.main(["measure", "{hub: gpt2, evil: 1}", "hi"]) == 2


def test_a_hub_source_on_the_command_line_cannot_name_a_folder(
    capsys: pytest.CaptureFixture,
) -> None:
    assert cli.main(["measure", "hub:../../etc", "hello"]) == 2
    assert "hub id '../../etc'" in capsys.readouterr().err


def test_a_package_file_outside_its_package_is_refused(tmp_path: Path) -> None:
    source = parse_source({"package": "blockcoupling", "file": "../../../../etc/passwd"})
    with pytest.raises(ModelSourceError, match="outside"):
        resolve(source)
    message = refusal(with_model({"package": "blockcoupling", "file": "../../../../etc/passwd"}))
    assert "models.evil.source" in message and "outside" in message
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ModelSourceError, match="outside"):
        resolve(parse_source({"path": str(folder), "file": "../../etc/passwd"}))
    outside = tmp_path / "x"
    outside.mkdir()
    with pytest.raises(HubNameError):
        contained(outside, tmp_path / "inside", "file")
