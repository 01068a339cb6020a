"""A tiny Llama GGUF for the smoke run (CI): ``assemble(path)`` writes a 2-block llama (width
32, byte-level BPE tokenizer of 256 bytes and 8 merges, float32 weights drawn from a fixed seed)
as transformers' GGUF loader reads it, the way the default's packaged GGUF models are read
(``package: blockcoupling_tinygguf, assemble: true``). About 150 KB; the same bytes every time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_LAYERS, D_MODEL, D_FF, N_HEADS, CONTEXT = 2, 32, 64, 2, 256
MERGES = ("Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s")
SEED = 0


def _byte_tokens() -> list[str]:
    """The 256 byte-level tokens of GPT-2's BPE, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[byte] for byte in range(256)]


def _tokens() -> list[str]:
    merged = ["".join(merge.split(" ")) for merge in MERGES]
    return ["<|endoftext|>", *_byte_tokens(), *merged]


def assemble(path: str | Path) -> Path:
    """Write the tiny GGUF to ``path`` (written beside it, then renamed) and return it."""
    import gguf

    path = Path(path)
    tokens = _tokens()
    rng = np.random.default_rng(SEED)

    def weight(*shape: int) -> np.ndarray:  # GGUF shapes are (out, in) as numpy arrays
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name("blockcoupling tiny llama")
    writer.add_block_count(N_LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(D_MODEL)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(D_MODEL // N_HEADS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(tokens) - 1))
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_tensor("token_embd.weight", weight(len(tokens), D_MODEL))
    for block in range(N_LAYERS):
        name = f"blk.{block}"
        writer.add_tensor(f"{name}.attn_norm.weight", np.ones(D_MODEL, np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{name}.{part}.weight", weight(D_MODEL, D_MODEL))
        writer.add_tensor(f"{name}.ffn_norm.weight", np.ones(D_MODEL, np.float32))
        writer.add_tensor(f"{name}.ffn_gate.weight", weight(D_FF, D_MODEL))
        writer.add_tensor(f"{name}.ffn_up.weight", weight(D_FF, D_MODEL))
        writer.add_tensor(f"{name}.ffn_down.weight", weight(D_MODEL, D_FF))
    writer.add_tensor("output_norm.weight", np.ones(D_MODEL, np.float32))
    writer.add_tensor("output.weight", weight(len(tokens), D_MODEL))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path
