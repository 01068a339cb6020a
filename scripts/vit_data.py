"""Rule vit_data: the split image set of the ViT sweep, as one .npz (CIFAR-10: downloaded once)."""

from blockcoupling import vision_data
from blockcoupling.runner import run_script


def main(sm):
    prepared = vision_data.prepare(
        sm.params.dataset, sm.params.split_seed, sm.params.test_fraction, sm.resources.data_dir
    )
    vision_data.write_prepared(prepared, sm.output[0])


run_script(snakemake, main)
