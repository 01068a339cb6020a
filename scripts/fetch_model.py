"""Rules fetch_model, fetch_checkpoint: one hub model revision into the hub cache (local rules:
online, where Snakemake runs), and its manifest."""

from blockcoupling import hub

hub.go_online()  # before huggingface_hub is imported: compute jobs alone are offline

from blockcoupling.runner import run_script  # noqa: E402


def main(sm):
    manifest = hub.fetch_model(sm.wildcards.repo, sm.wildcards.revision, sm.output.folder)
    if sm.params.checkpoint:  # how many checkpoint revisions the cache held with this one in it
        manifest["checkpoints_on_disk"] = hub.checkpoints_on_disk(sm.params.cache_dir)
    hub.write_manifest(manifest, sm.output.manifest)


run_script(snakemake, main)
