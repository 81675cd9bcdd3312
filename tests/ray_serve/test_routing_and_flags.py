"""The routing key the prefix-affinity router matches, the replicas' server flags, and
``radixlm serve-ray``'s flag and startup errors (no Ray cluster is started)."""

from __future__ import annotations

import json
import subprocess
import sys

from radixlm.srt.ray_serve.cli import replica_argv
from radixlm.srt.ray_serve.routing_key import MAX_KEY_CHARS, routing_key
from radixlm.srt.server_args import ServerArgs
from tests.server.helpers import free_port

SERVE_RAY = [sys.executable, "-m", "radixlm.cli", "serve-ray"]


def _key(path: str, body) -> str:
    return routing_key(path, json.dumps(body).encode())


def test_generate_key_is_the_text_or_the_token_ids():
    assert _key("/generate", {"text": "Once upon a time"}) == "Once upon a time"
    assert _key("/generate", {"text": ["first", "second"]}) == "first"
    assert _key("/generate", {"input_ids": [5, 17, 3]}) == "5 17 3 "
    assert _key("/generate", {"input_ids": [[5, 17], [9]]}) == "5 17 "
    # Token prompts share a key prefix exactly when they share a token prefix.
    assert not _key("/generate", {"input_ids": [51, 7]}).startswith(_key("/generate", {"input_ids": [5]}))


def test_openai_keys():
    assert _key("/v1/completions", {"prompt": "Hello"}) == "Hello"
    assert _key("/v1/completions", {"prompt": [1, 2]}) == "1 2 "
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}]}
    assert _key("/v1/chat/completions", chat) == "system: Be brief.\nuser: Hi!\n"
    longer = {"messages": [*chat["messages"], {"role": "assistant", "content": "Hello."}]}
    assert _key("/v1/chat/completions", longer).startswith(_key("/v1/chat/completions", chat))
    assert _key("/v1/responses", {"instructions": "Sys. ", "input": "Q"}) == "Sys. Q"
    assert _key("/v1/responses", {"input": [{"role": "user", "content": "Q"}]}) == "user: Q\n"


def test_no_prompt_no_key():
    assert routing_key("/generate", b"") == ""
    assert routing_key("/generate", b"not json") == ""
    assert routing_key("/generate", b"[1, 2]") == ""
    assert _key("/get_server_info", {"text": "x"}) == ""
    assert _key("/generate", {"text": 5}) == ""


def test_key_is_capped():
    assert len(_key("/generate", {"text": "a" * (3 * MAX_KEY_CHARS)})) == MAX_KEY_CHARS


def test_replica_flags_are_the_non_default_ones_without_host_and_port():
    args = ServerArgs(model_path="/m", host="0.0.0.0", port=8000, page_size=4, disable_radix_cache=True)
    assert replica_argv(args, 2.0) == ["--model-path", "/m", "--cpu-threads", "2", "--page-size", "4",
                                       "--disable-radix-cache"]
    assert replica_argv(ServerArgs(cpu_threads=3), 0.5) == ["--cpu-threads", "3"]
    assert replica_argv(ServerArgs(), 0.5) == ["--cpu-threads", "1"]
    # What a replica gets parses back to the same options.
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    back = ServerArgs.from_cli_args(parser.parse_args(replica_argv(args, 2.0)))
    assert (back.model_path, back.page_size, back.disable_radix_cache, back.cpu_threads) == ("/m", 4, True, 2)


def test_bad_flags_exit_2_and_a_missing_model_is_one_error_line():
    """(Without Ray installed the second is "serve-ray needs Ray Serve", also one error line.)"""
    proc = subprocess.run([*SERVE_RAY, "--num-replicas", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--num-replicas must be >= 1" in proc.stderr
    proc = subprocess.run([*SERVE_RAY, "--model-path", "/no/such/model", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("radixlm: error:"), proc.stderr
