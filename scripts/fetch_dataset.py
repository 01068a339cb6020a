"""Rule fetch_dataset: the card and data files of one hub prompt dataset into the hub cache
(a local rule: online, where Snakemake runs), and its manifest."""

from blockcoupling import hub

hub.go_online()  # before huggingface_hub is imported: compute jobs alone are offline

from blockcoupling.runner import run_script  # noqa: E402


def main(sm):
    manifest = hub.fetch_dataset(sm.wildcards.repo, sm.params.config, sm.output.folder)
    hub.write_manifest(manifest, sm.output.manifest)


run_script(snakemake, main)
