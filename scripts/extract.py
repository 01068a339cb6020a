"""Rule extract: block Jacobians -> SVDs -> exact coupling statistics and trajectory metrics."""

from blockcoupling import prompts
from blockcoupling.io import provenance, write_netcdf
from blockcoupling.measure import MeasureConfig, measure
from blockcoupling.workflow import load_for_rule, run_script


def main(sm):
    spec = dict(sm.params.extract)
    spec.pop("device", None)
    config = MeasureConfig(
        **{
            **spec,
            "variants": tuple(spec.get("variants", ("ujv", "vju"))),
            "token_layers": tuple(spec.get("token_layers", ())),
        }
    )
    model, tokenizer, attrs = load_for_rule(sm.params.model)
    items = prompts.read_jsonl(sm.input.prompts)
    datasets = measure(
        model, tokenizer, items, config, attrs=provenance(sm.params.extract, **attrs)
    )
    for name, dataset in datasets.items():
        write_netcdf(dataset, sm.output[name])


run_script(snakemake, main)
