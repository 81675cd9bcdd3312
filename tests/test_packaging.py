"""Every source folder with an __init__.py is listed in pyproject's packages (a non-editable install
would silently leave out the others)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = cfg["package-dir"]
    expected = set()
    for pkg, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            expected.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert expected - listed == set(), f"missing from [tool.setuptools] packages: {sorted(expected - listed)}"


def test_kernel_sources_ship_as_package_data():
    """The C++ CPU kernels are compiled on first use from the installed sources: a wheel must carry them."""
    import fnmatch

    from radixlm.kernels.cpu_extension import HEADERS, SOURCES

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = cfg["package-data"]["radixlm.kernels"]
    kernels = REPO / cfg["package-dir"]["radixlm.kernels"]
    for src in [*SOURCES, *HEADERS]:
        assert src.exists()
        assert any(fnmatch.fnmatch(str(src.relative_to(kernels)), p) for p in patterns), src
    assert {p.name for p in kernels.rglob("*.cpp")} == {s.name for s in SOURCES}
    # headers are in the build folder's digest: one left out would leave a stale build after an edit
    assert {p.name for p in kernels.rglob("*.h")} == {h.name for h in HEADERS}


def test_uvicorn_serves_http_with_httptools():
    """httptools is a dependency so that uvicorn's ``http="auto"`` (what the server runs) takes its C
    parser and writer instead of h11's pure Python for every streamed SSE chunk."""
    from uvicorn.config import Config

    config = Config(app=lambda scope, receive, send: None, http="auto")
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
