"""Rule fetch_dataset: the card and data files of one hub prompt dataset, at its pinned
revision (the lock file's commit when it holds one), into the hub cache (a local rule: online,
where Snakemake runs); its manifest, and the commit fetched recorded in the lock file."""

from blockcoupling.lm import hub

hub.go_online()  # before huggingface_hub is imported: compute jobs alone are offline

from blockcoupling.runtime.runner import run_script  # noqa: E402


def main(sm):
    repo, revision, lock = sm.wildcards.repo, sm.params.revision, sm.params.lock
    commit = hub.locked_commit(lock, "dataset", repo, revision) if lock else None
    manifest = hub.fetch_dataset(
        repo, sm.params.config, sm.output.folder, revision, commit, lock, sm.output.manifest
    )
    if lock:
        hub.record(lock, "dataset", repo, revision, manifest["commit"], manifest["hashes"])


run_script(snakemake, main)
