"""``--quantization gguf``: linear layers keep the GGUF file's Q8_0 / Q4_0 / Q4_1 blocks as they are.

The model is first loaded as usual from the fp32 folder the file was converted to (model_loader), so
every parameter exists and norms, biases and the embedding table are float. Then, for each linear
layer, the file's tensors for it (``blk.N.attn_q`` / ``attn_k`` / ``attn_v`` -> ``qkv_proj``,
``attn_output`` -> ``o_proj``, ``ffn_gate`` / ``ffn_up`` -> ``gate_up_proj``, ``ffn_down`` ->
``down_proj``, ``output`` or, with tied embeddings, ``token_embd`` -> the LM head) are read as raw
block rows (``gguf.GGUFReader``, one row of bytes per output feature) and sharded for this rank
exactly as the float weights are: column-parallel layers by rows, row-parallel ones by whole blocks
along the row. llama.cpp stores the q and k rows of a Llama model permuted (for its RoPE layout);
the converter undoes it, and so does this on block rows (the permutation moves output rows only).

A layer whose tensors are of another type (F32, F16, K-quants, ...) or of mixed types stays float.
Before a layer is switched, its blocks are dequantized and compared with the float weights loaded
for it: they must be equal (both are gguf-py's dequantization of the same bytes), so a wrong tensor
name, permutation or shard cannot go unnoticed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from radixlm.kernels.quant.formats import BLOCK, get_format
from radixlm.srt.model_loader import ModelLoadError

_TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}  # GGMLQuantizationType name -> our format


def plan_gguf(model: nn.Module, path: Path, tp, plan) -> None:
    """Fill ``plan.backends`` / ``plan.layers`` (a ``QuantizationPlan``) from the GGUF file ``path``.

    Raises:
        ModelLoadError: the file cannot be read, lacks a tensor the model needs, or its blocks do not
            dequantize to the weights the model was loaded with.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    tensors = {t.name: t for t in reader.tensors}
    arch = str(reader.get_field("general.architecture").contents())
    cfg = model.config
    heads, kv_heads = int(cfg.num_attention_heads), int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    permute = {"q": heads, "k": kv_heads} if arch == "llama" else {}  # as transformers' LlamaTensorProcessor
    layers = getattr(model, "layers", None)
    if layers is None or not hasattr(model, "lm_head"):
        raise ModelLoadError(f"--quantization gguf does not know the layers of {type(model).__name__}")
    counts: Counter = Counter()
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        jobs = [
            (attn.qkv_proj, [("q", f"blk.{i}.attn_q.weight"), ("k", f"blk.{i}.attn_k.weight"), ("v", f"blk.{i}.attn_v.weight")]),
            (attn.o_proj, [(None, f"blk.{i}.attn_output.weight")]),
            (mlp.gate_up_proj, [("0", f"blk.{i}.ffn_gate.weight"), ("1", f"blk.{i}.ffn_up.weight")]),
            (mlp.down_proj, [(None, f"blk.{i}.ffn_down.weight")]),
        ]
        for module, shards in jobs:
            counts[_plan_layer(module, shards, tensors, permute, tp, plan, path)] += 1
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    counts[_plan_layer(model.lm_head, [(None, head)], tensors, {}, tp, plan, path)] += 1
    plan.layers = dict(counts)


def _plan_layer(module: nn.Module, shards: list[tuple[Optional[str], str]], tensors: dict, permute: dict, tp,
                plan, path: Path) -> str:
    """Add ``module``'s backend to ``plan`` when its tensors are all of one supported type; returns
    the format name it got (or ``dense``)."""
    from radixlm.kernels.quant.gemm import QuantGemm

    missing = [name for _, name in shards if name not in tensors]
    if missing:
        raise ModelLoadError(f"GGUF file {path} has no tensor {missing[0]}")
    kinds = {tensors[name].tensor_type.name for _, name in shards}
    weight = module.weight.data
    in_features = weight.shape[1]
    if len(kinds) != 1 or next(iter(kinds)) not in _TYPES or in_features % BLOCK:
        return "dense"
    fmt = get_format(_TYPES[next(iter(kinds))])
    packed = torch.zeros(weight.shape[0], fmt.row_bytes(in_features), dtype=torch.uint8)
    for shard_id, name in shards:
        rows = torch.from_numpy(_block_rows(tensors[name], permute.get(shard_id)))
        if hasattr(module, "in_per_rank"):  # row-parallel: this rank's blocks of every row
            per_rank = fmt.row_bytes(in_features)
            packed.copy_(rows.narrow(1, tp.rank * per_rank, per_rank))
        else:
            module.weight_loader(packed, rows, shard_id)
    backend = QuantGemm(fmt.name, in_features, packed)
    if not torch.equal(backend.dequantize(packed).to(weight.dtype), weight):
        raise ModelLoadError(f"the {fmt.name} blocks of {shards[0][1]} in {path} do not dequantize to the weights "
                             "converted from it (a stale conversion cache? delete it and retry)")
    plan.backends[module] = backend
    return fmt.name


def _block_rows(tensor, n_head: Optional[int]) -> np.ndarray:
    """The tensor's bytes as (output rows, row bytes); rows un-permuted for q/k (``n_head`` heads)."""
    rows = np.array(tensor.data, copy=True).view(np.uint8)  # a copy: the reader's arrays are read-only file maps
    rows = rows.reshape(rows.shape[0], -1)
    if n_head:
        half = rows.shape[0] // n_head // 2
        rows = np.ascontiguousarray(rows.reshape(n_head, half, 2, rows.shape[1]).swapaxes(1, 2).reshape(rows.shape))
    return rows
