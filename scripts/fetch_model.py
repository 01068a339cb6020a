"""Rules fetch_model, fetch_checkpoint: one hub model revision (the lock file's commit when it
holds one) into the hub cache (local rules: online, where Snakemake runs); its manifest, and
the commit fetched recorded in the lock file."""

from blockcoupling.lm import hub

hub.go_online()  # before huggingface_hub is imported: compute jobs alone are offline

from blockcoupling.runtime.runner import run_script  # noqa: E402


def main(sm):
    repo, revision, lock = sm.wildcards.repo, sm.wildcards.revision, sm.params.lock
    commit = hub.locked_commit(lock, "model", repo, revision) if lock else None
    manifest = hub.fetch_model(
        repo, revision, sm.output.folder, commit, lock, sm.resources.hub_keys, sm.output.manifest
    )
    if sm.params.checkpoint:  # how many checkpoint revisions the cache held with this one in it
        manifest["checkpoints_on_disk"] = hub.checkpoints_on_disk(sm.params.cache_dir)
    hub.write_manifest(manifest, sm.output.manifest)
    if lock:
        hub.record(lock, "model", repo, revision, manifest["commit"], manifest["hashes"])


run_script(snakemake, main)
