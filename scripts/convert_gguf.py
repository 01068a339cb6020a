"""Rule convert_gguf: a GGUF model source written once as a save_pretrained folder (float32
safetensors, tokenizer.json), which the model's jobs read instead of parsing the GGUF."""

from pathlib import Path

from blockcoupling.lm.models import convert_gguf
from blockcoupling.lm.sources import parse_source
from blockcoupling.runtime.runner import run_script


def main(sm):
    convert_gguf(parse_source(sm.params.source), Path(sm.output[0]))


run_script(snakemake, main)
