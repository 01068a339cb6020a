"""Rule vit_extract: block Jacobians of one trained ViT on the first test images -> statistics."""

import torch

from blockcoupling.io import provenance, write_netcdf
from blockcoupling.measure import measure_inputs
from blockcoupling.models import resolve_device
from blockcoupling.options import PromptText
from blockcoupling.runner import run_script
from blockcoupling.vision_data import read_prepared
from blockcoupling.vit import load_vit
from blockcoupling.vit_config import ViTRunConfig, measure_config


def main(sm):
    run = ViTRunConfig(**sm.params.run)
    config = measure_config(sm.params.extract, sm.resources.vjp_chunk or None)
    device = resolve_device(sm.resources.device)
    model = load_vit(sm.input.model, run, device)
    data = read_prepared(sm.input.data)
    n = min(sm.params.extract["images"], len(data.y_test))
    images = torch.from_numpy(data.normalized(data.x_test[:n])).to(device)
    items = [PromptText(f"test{i:05d}", str(int(data.y_test[i])), "") for i in range(n)]
    attrs = provenance(sm.params.extract, model="vit", source=sm.input.model, **run.to_dict())
    datasets = measure_inputs(
        model, [{"x": images[i : i + 1]} for i in range(n)], items, config, attrs
    )
    for name, dataset in datasets.items():
        write_netcdf(dataset, sm.output[name])


run_script(snakemake, main)
