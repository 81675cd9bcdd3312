"""The Engine loads from a GGUF file as from an HF folder, honours --dtype, and sizes its KV pool
from --max-total-tokens or the memory fraction."""

from __future__ import annotations

import pytest
import torch

from radixlm.srt.engine import Engine
from radixlm.srt.server_args import ServerArgsError
from tests.conftest import STORIES_GGUF

SP = {"temperature": 0, "max_new_tokens": 16}


def test_gguf_engine_equals_hf_folder_engine(stories_path, tmp_path):
    from_folder = Engine(stories_path, dtype="float32", max_total_tokens=1024).generate("Once upon a time", SP)
    from_gguf = Engine(str(STORIES_GGUF), dtype="float32", max_total_tokens=1024, cache_dir=str(tmp_path)).generate("Once upon a time", SP)
    assert from_gguf["output_ids"] == from_folder["output_ids"]
    assert from_gguf["text"] == from_folder["text"]


def test_dtype_bfloat16_is_honoured(stories_path):
    engine = Engine(stories_path, max_total_tokens=1024, dtype="bfloat16")
    runner = engine.worker.model_runner
    assert next(runner.model.parameters()).dtype == torch.bfloat16
    assert runner.kv_pool.k_buffers[0].dtype == torch.bfloat16
    out = engine.generate("Once upon a time", SP)
    assert out["meta_info"]["completion_tokens"] == 16 and out["text"].startswith(",")


def test_pool_sizes(stories_path):
    exact = Engine(stories_path, dtype="float32", max_total_tokens=1000, page_size=16)
    assert exact.worker.max_total_num_tokens == 992  # whole pages only
    auto = Engine(stories_path, dtype="float32", mem_fraction_static=0.01, max_running_requests=4)
    # capped at every running request at full context
    assert 0 < auto.worker.max_total_num_tokens <= 4 * auto.model_config.context_len


def test_unknown_engine_option_is_an_error(stories_path):
    with pytest.raises(ServerArgsError, match="bogus_option"):
        Engine(stories_path, dtype="float32", bogus_option=1)
    with pytest.raises(ServerArgsError, match="page-size"):
        Engine(stories_path, dtype="float32", page_size=3)
