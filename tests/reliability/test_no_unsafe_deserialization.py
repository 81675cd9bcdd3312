"""No code path that touches request data can execute it: a static scan (``ast``, so comments and
docstrings that mention pickle do not count) of every module under ``lang/``, ``srt/``,
``managers/``, ``constrained/``, ``radix_cache/`` and the ``radixlm`` package root.

Forbidden: importing ``pickle``/``cPickle``/``_pickle``/``dill``/``cloudpickle``/``marshal``/``shelve``
/``jsonpickle``; calling the builtins ``eval``/``exec``/``compile``/``__import__``; ``yaml.load``
(also ``unsafe_load``/``full_load``/``load_all``); ``torch.load`` without ``weights_only=True``
(model loading passes it, ``srt/model_loader.py``); pyzmq's pickling ``send_pyobj``/``recv_pyobj``;
``allow_pickle=True`` (numpy); ``pandas.read_pickle``. The IPC between processes is msgspec.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ["lang", "srt", "managers", "constrained", "radix_cache", "_radixlm"]

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}
UNSAFE_ATTRS = {"send_pyobj", "recv_pyobj", "read_pickle", "unsafe_load", "full_load"}
YAML_LOADS = {"load", "load_all"}


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` of a Name/Attribute chain ('' for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _true_keyword(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)


def unsafe_uses(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every forbidden import or call in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            if name in UNSAFE_BUILTINS or name in {f"builtins.{b}" for b in UNSAFE_BUILTINS}:
                found.append(f"{where}: {name}(...)")
            elif last in UNSAFE_ATTRS or (name.startswith("yaml.") and last in YAML_LOADS):
                found.append(f"{where}: {name}(...)")
            elif name == "torch.load" and not _true_keyword(node, "weights_only"):
                found.append(f"{where}: torch.load without weights_only=True")
            elif _true_keyword(node, "allow_pickle"):
                found.append(f"{where}: {name}(allow_pickle=True)")
    return found


def _sources() -> list[Path]:
    files = [p for d in SCANNED for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 30, f"scanned too few files ({len(files)}): did the layout change?"
    return files


def test_request_paths_never_unpickle_or_eval():
    found = [hit for path in _sources() for hit in unsafe_uses(path.read_text(), str(path.relative_to(REPO)))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "import pickle", "from pickle import loads", "import marshal as m", "import shelve", "from dill import loads",
    "eval(body)", "exec(code)", "builtins.eval(x)", "yaml.load(s)", "yaml.full_load(s)", "torch.load(f)",
    "torch.load(f, weights_only=False)", "sock.recv_pyobj()", "np.load(f, allow_pickle=True)",
])
def test_the_scan_catches(snippet):
    assert unsafe_uses(snippet, "x.py"), snippet


@pytest.mark.parametrize("snippet", [
    '"""we never use pickle or eval( here"""', "# import pickle", "model.eval()", "torch.load(f, weights_only=True)",
    "spec.loader.exec_module(m)", "json.loads(s)", "msgspec.json.decode(b)", "re.compile(p)",
])
def test_the_scan_allows(snippet):
    assert not unsafe_uses(snippet, "x.py"), snippet
