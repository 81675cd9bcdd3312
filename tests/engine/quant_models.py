"""Test models with quantized GGUF tensors, made from the shipped stories260K GGUF (all F32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# stories260K's linears, by GGUF tensor name suffix -> the type written; ffn_down (in_features 172,
# not a multiple of 32) stays F32, so the model mixes quantized and float layers.
STORIES_QUANT_TYPES = {"attn_q": "Q4_1", "attn_k": "Q4_1", "attn_v": "Q4_1", "attn_output": "Q4_0",
                       "ffn_gate": "Q8_0", "ffn_up": "Q8_0", "output": "Q8_0"}
# The quantized_layers the server reports for it: per layer qkv q4_1, o q4_0, gate_up q8_0, down dense;
# the LM head q8_0.
STORIES_QUANT_LAYERS = {"q4_1": 5, "q4_0": 5, "q8_0": 6, "dense": 5}


def write_quantized_gguf(src: Path, dst: Path, types: dict[str, str]) -> Path:
    """Copy GGUF ``src`` to ``dst`` with the tensors named ``blk.N.<suffix>.weight`` / ``<suffix>.weight``
    quantized to ``types[suffix]`` (a ``gguf.GGMLQuantizationType`` name) by gguf-py."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.get_field("general.architecture").contents())
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    for name, field in reader.fields.items():
        if name == "general.architecture" or name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for tensor in reader.tensors:
        suffix = tensor.name.split(".")[-2]
        data = np.asarray(tensor.data)
        qtype = types.get(suffix)
        if qtype is not None and tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            q = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(tensor.name, gguf.quants.quantize(data.astype(np.float32), q), raw_dtype=q)
        else:
            writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
