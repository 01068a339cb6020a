"""Rule vit_data: the split image set of the ViT sweep, as one .npz (CIFAR-10: downloaded once)."""

from pathlib import Path

from blockcoupling.files import manifest
from blockcoupling.runtime.runner import run_script
from blockcoupling.vit import data as vision_data


def main(sm):
    prepared = vision_data.prepare(
        sm.params.dataset, sm.params.split_seed, sm.params.test_fraction, sm.resources.data_dir
    )
    vision_data.write_prepared(prepared, sm.output[0])
    data_dir = Path(sm.resources.data_dir)  # recorded when a results folder holds it
    manifest.record((p for p in data_dir.rglob("*") if p.is_file()), sm.rule)


run_script(snakemake, main)
