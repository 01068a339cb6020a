"""Rule vit_extract: block Jacobians of one trained ViT on the first test images -> statistics."""

import torch

from blockcoupling.files.io import provenance, write_netcdf
from blockcoupling.jacobians.extract import extract_inputs
from blockcoupling.jacobians.options import PromptText
from blockcoupling.runtime.device import resolve_device
from blockcoupling.runtime.runner import run_script
from blockcoupling.vit.config import ViTRunConfig, extract_config
from blockcoupling.vit.data import read_prepared
from blockcoupling.vit.model import load_vit


def main(sm):
    run = ViTRunConfig(**sm.params.run)
    config = extract_config(sm.params.extract, sm.resources.vjp_chunk or None)
    device = resolve_device(sm.resources.device)
    model = load_vit(sm.input.model, run, device)
    data = read_prepared(sm.input.data)
    n = min(sm.params.extract["images"], len(data.y_test))
    images = torch.from_numpy(data.normalized(data.x_test[:n])).to(device)
    items = [PromptText(f"test{i:05d}", str(int(data.y_test[i])), "") for i in range(n)]
    attrs = provenance(sm.params.extract, model="vit", source=sm.input.model, **run.to_dict())
    datasets = extract_inputs(
        model, [{"x": images[i : i + 1]} for i in range(n)], items, config, attrs
    )
    for name, dataset in datasets.items():
        write_netcdf(dataset, sm.output[name])


run_script(snakemake, main)
