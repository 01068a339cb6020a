"""The fourth round of hostile inputs and faults (issue 26): hub ids and revisions the hub
would refuse, paths out of their folder, custom model code, non-finite values that used to
shrink a statistic silently, specta that cannot carry the asked K, ``verify`` and deletions,
planner nonsense and late config errors."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from blockcoupling import cli
from blockcoupling import workflow as wf
from blockcoupling.hub_names import HubNameError, check_repo_id, check_revision, contained
from blockcoupling.models import ModelSourceError, parse_source, resolve

REPO = Path(__file__).resolve().parents[1]
SCHEMA = str(REPO / "schemas" / "config.schema.yaml")


def smoke(**changes: dict) -> dict:
    """config/smoke.yaml with sections updated (one level deep), schema-validated."""
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    for section, values in changes.items():
        config[section] = {**config.get(section, {}), **values}
    validate(config, SCHEMA)
    return config


def refusal(config: dict) -> str:
    """The one-line ConfigError of the schema or check_config for ``config``."""
    config = copy.deepcopy(config)
    with pytest.raises(wf.ConfigError) as error:
        wf.validate_config(config, SCHEMA)
        wf.check_config(config, REPO)
    message = str(error.value)
    assert "\n" not in message
    return message


def with_model(source: dict, **spec: object) -> dict:
    config = smoke()
    config["models"] = {"evil": {"source": source, **spec}}
    return config


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
    outside = tmp_path / "x"
    outside.mkdir()
    with pytest.raises(HubNameError):
        contained(outside, tmp_path / "inside", "file")
