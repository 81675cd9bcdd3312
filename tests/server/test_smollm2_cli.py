"""The README's run command: ``radixlm serve`` with no --model-path serves the SmolLM2 demo model."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from .helpers import greedy


def _radixlm_command() -> list[str]:
    script = Path(sys.executable).with_name("radixlm")
    if script.exists():
        return [str(script), "serve"]
    found = shutil.which("radixlm")
    return [found, "serve"] if found else [sys.executable, "-m", "radixlm.cli", "serve"]


@pytest.fixture(scope="module")
def demo_server(launch):
    from radixlm.srt.model_loader import ModelLoadError, find_demo_model

    try:
        find_demo_model()
    except ModelLoadError as e:
        pytest.skip(str(e))
    return launch(["--max-total-tokens", "8192"], command=_radixlm_command(), timeout_s=600)


def test_demo_model_answers_with_english(demo_server):
    with demo_server.client(timeout=300) as http:
        info = http.get("/get_model_info").json()
        assert "SmolLM2-135M-Instruct" in info["model_path"] and info["architectures"] == ["LlamaForCausalLM"]
        readme = http.post("/generate", json={"text": "The capital of France is", "sampling_params": greedy(16)})
        assert readme.status_code == 200, readme.text
        assert readme.json()["text"].startswith(" Paris."), readme.json()  # greedy: " Paris.\n\nThe answer is: ..."
        story = http.post("/generate", json={"text": "Once upon a time", "sampling_params": greedy(24)}).json()
        words = re.findall(r"[A-Za-z]+", story["text"])
        assert len(words) >= 12 and story["text"].isascii(), story  # ", the city of Nova Haven was a thriving ..."
        chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        answer = http.post("/generate", json={"text": chat, "sampling_params": greedy(16)}).json()
        assert "Paris" in answer["text"], answer
        assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}  # <|im_end|>
