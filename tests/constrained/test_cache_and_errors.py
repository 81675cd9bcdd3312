"""GrammarSpec parsing, the async compile cache, and fast GrammarError for invalid grammars."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from radixlm.constrained import GrammarCache, GrammarError, GrammarSpec
from radixlm.constrained.base import CompiledGrammar, GrammarBackend, compiler_message
from radixlm.srt.sampling_params import SamplingParams
from tests.constrained.conftest import get_backend, load_model
from tests.constrained.driver import generate

BACKENDS = ("xgrammar", "outlines")


def test_spec_from_sampling_params() -> None:
    assert GrammarSpec.from_sampling_params(SamplingParams()) is None
    assert GrammarSpec.from_sampling_params(SamplingParams(regex="a+")) == GrammarSpec("regex", "a+")
    assert GrammarSpec.from_sampling_params(SamplingParams(ebnf='root ::= "x"')) == \
        GrammarSpec("ebnf", 'root ::= "x"')
    params = SamplingParams.from_dict({"json_schema": {"type": "object", "properties": {}}})
    spec = GrammarSpec.from_sampling_params(params)
    assert spec is not None and spec.kind == "json_schema" and '"properties"' in spec.text
    for text in ("$$ANY$$", '{"type": "object"}', '{"type":"object"}'):
        assert GrammarSpec.from_sampling_params(SamplingParams(json_schema=text)) == \
            GrammarSpec.json_object()
    with pytest.raises(GrammarError, match="only one of"):
        GrammarSpec.from_sampling_params(SamplingParams(regex="a", ebnf="root ::= x"))
    with pytest.raises(GrammarError):
        GrammarSpec("yaml", "x")  # type: ignore[arg-type]
    assert hash(GrammarSpec("regex", "a")) == hash(GrammarSpec("regex", "a"))


INVALID = [
    GrammarSpec("json_schema", "INVALID"),
    GrammarSpec("json_schema", '{"type": "foo"}'),
    GrammarSpec("json_schema", '{"$ref": "#/nope"}'),
    GrammarSpec("json_schema", '{"type": "integer", "minimum": 5, "maximum": 2}'),
    GrammarSpec("json_schema", '{"type": "string", "pattern": "(("}'),
    GrammarSpec("regex", "("),
    GrammarSpec("regex", "a{3,1}"),
]
INVALID_EBNF = [GrammarSpec("ebnf", "root ::= "), GrammarSpec("ebnf", 'foo ::= "a"'),
                GrammarSpec("ebnf", "root ::= bar")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_grammars_raise_fast(backend: str) -> None:
    be = get_backend(backend, "smollm2")
    specs = INVALID + (INVALID_EBNF if backend == "xgrammar" else [GrammarSpec("ebnf", "root ::= x")])
    for spec in specs:
        start = time.perf_counter()
        with pytest.raises(GrammarError) as info:
            be.compile(spec)
        assert time.perf_counter() - start < 1.0, spec
        msg = str(info.value)
        assert msg and not msg.startswith("[") and "/project/" not in msg, msg


def test_error_messages_are_the_compilers() -> None:
    be = get_backend("xgrammar", "stories")
    with pytest.raises(GrammarError, match="parenthesis is not closed"):
        be.compile(GrammarSpec("regex", "("))
    with pytest.raises(GrammarError, match='Rule "bar" is not defined'):
        be.compile(GrammarSpec("ebnf", "root ::= bar"))
    with pytest.raises(GrammarError, match="Failed to parse JSON"):
        be.compile(GrammarSpec("json_schema", "INVALID"))
    assert compiler_message(RuntimeError("[10:22:57] /project/cpp/x.cc:94: Check failed: "
                                         "(a) is false: boom")) == "boom"


@pytest.mark.parametrize("schema", [
    '{"type": "integer", "multipleOf": 3}',
    '{"type": "array", "items": {"type": "integer"}, "uniqueItems": true}',
    '{"type": "object", "patternProperties": {"^x": {"type": "integer"}}}',
    '{"type": "number", "exclusiveMinimum": 0.5}',
    '{"type": "number", "minimum": 0.25}',
])
def test_outlines_rejects_features_it_would_ignore(schema: str) -> None:
    be = get_backend("outlines", "stories")
    with pytest.raises(GrammarError, match="outlines"):
        be.compile(GrammarSpec("json_schema", schema))


class _CountingBackend(GrammarBackend):
    """Wraps a real backend; counts compiles and can be slowed down."""

    name = "xgrammar"

    def __init__(self, inner: GrammarBackend, delay: float = 0.0):
        super().__init__(inner.vocab_size, inner.eos_token_ids)
        self.inner, self.delay, self.calls = inner, delay, 0
        self._lock = threading.Lock()

    def _compile(self, spec: GrammarSpec):
        with self._lock:
            self.calls += 1
        time.sleep(self.delay)
        return self.inner.compile(spec).handle

    def _new_matcher(self, compiled: CompiledGrammar):
        return self.inner.new_matcher(compiled)


def test_cache_compiles_once_per_spec() -> None:
    m = load_model("stories")
    backend = _CountingBackend(get_backend("xgrammar", "stories"), delay=0.2)
    cache = GrammarCache(backend, max_workers=2)
    try:
        spec = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                        "required": ["a"]})
        first = cache.request(spec)
        assert not first.done()  # returned before the (0.2 s) compile finished: it runs on the pool
        second = cache.request(GrammarSpec("json_schema", spec.text))  # same (kind, text)
        assert second is first
        compiled = first.result(timeout=10)
        third = cache.request(spec)
        assert third is first and third.done()
        assert (cache.num_compiles, cache.num_hits, backend.calls) == (1, 2, 1)
        # Each request gets its own matcher over the shared compiled grammar.
        a, b = backend.new_matcher(compiled), backend.new_matcher(compiled)
        out = generate(a, m.vocab_size, m.bias, 0)
        assert out.terminated and b.num_accepted == 0
        cache.request(GrammarSpec("regex", "x+")).result(timeout=10)
        assert cache.num_compiles == 2 and len(cache) == 2
    finally:
        cache.shutdown()


def test_cache_threads_share_one_future() -> None:
    backend = _CountingBackend(get_backend("xgrammar", "stories"), delay=0.1)
    cache = GrammarCache(backend)
    spec = GrammarSpec("regex", "[a-z]{2,5}")
    futures: list[Future] = []
    lock = threading.Lock()

    def ask() -> None:
        fut = cache.request(spec)
        with lock:
            futures.append(fut)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(f) for f in futures}) == 1
    futures[0].result(timeout=10)
    assert backend.calls == 1 and cache.num_compiles == 1 and cache.num_hits == 7
    cache.shutdown()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_invalid_grammar_fails_fast_and_is_cached(backend: str) -> None:
    cache = GrammarCache(get_backend(backend, "stories"))
    try:
        spec = GrammarSpec("json_schema", "INVALID")
        start = time.perf_counter()
        with pytest.raises(GrammarError):
            cache.request(spec).result(timeout=1.0)
        assert time.perf_counter() - start < 1.0
        with pytest.raises(GrammarError):
            cache.request(spec).result(timeout=0)  # cached failure: already done
        assert cache.num_compiles == 1 and cache.num_hits == 1
        # The cache still serves good grammars afterwards.
        assert cache.get(GrammarSpec("regex", "ok"), timeout=5).spec.text == "ok"
    finally:
        cache.shutdown()


def test_cache_cancelled_future_is_recompiled_and_clear() -> None:
    backend = _CountingBackend(get_backend("xgrammar", "stories"), delay=0.3)
    cache = GrammarCache(backend, max_workers=1)
    try:
        blocker = cache.request(GrammarSpec("regex", "a"))  # occupies the only worker
        queued = cache.request(GrammarSpec("regex", "b"))
        assert queued.cancel()  # e.g. the scheduler's compile timeout fired
        again = cache.request(GrammarSpec("regex", "b"))
        assert again is not queued
        again.result(timeout=10)
        blocker.result(timeout=10)
        assert cache.num_compiles == 3
        cache.clear()
        assert len(cache) == 0 and GrammarSpec("regex", "a") not in cache
        cache.request(GrammarSpec("regex", "a")).result(timeout=10)
        assert cache.num_compiles == 4
    finally:
        cache.shutdown()
    with pytest.raises(RuntimeError):
        cache.request(GrammarSpec("regex", "c"))


def test_cache_evicts_least_recently_used() -> None:
    cache = GrammarCache(get_backend("xgrammar", "stories"), max_entries=2)
    try:
        for text in ("a", "b", "a", "c"):
            cache.request(GrammarSpec("regex", text)).result(timeout=10)
        assert GrammarSpec("regex", "a") in cache and GrammarSpec("regex", "b") not in cache
    finally:
        cache.shutdown()
