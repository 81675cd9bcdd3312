"""Shared fixtures: paths of the offline models and small helpers. Tests are CPU-only and offline."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# stories260K ships in the repository (tests/assets/models/README.md); nothing is read from outside it.
MODELS = (REPO / "tests" / "assets" / "models").resolve()  # servers report resolved paths
STORIES_HF = MODELS / "stories260k-hf"
STORIES_GGUF = MODELS / "stories260k" / "stories260K.gguf"

# Test prompts for stories260K: different lengths, no leading whitespace (HF and SentencePiece
# disagree there).
STORY_PROMPTS = [
    "Once upon a time",
    "Lily",
    "The cat sat on the mat and",
    "One day, a little boy named Tim went to the park with his mom. He saw a big",
    "The sun was shining",
    "Sara had a red ball. She liked to",
    "Once upon a time, there was a dog named Max. Max loved to run and play. One day, Max found a bone in the garden. He was very happy and",
    "Ben and Mia were best friends",
    "The bird",
    "It was a rainy day and the children could not go outside, so they",
    "Mom said",
    "Tom wanted a cookie, but the jar was too high. He",
    "A little fish lived in a pond",
    "The old tree in the forest was very tall. Every morning, the birds would sing in its branches and the squirrels would",
    "Anna found a shiny",
    "Once there was a happy frog who liked to jump",
    "The dog barked at the",
    "Jack and Jill went up the hill to get some water. When they got to the top, they",
]


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def stories_path() -> str:
    if not STORIES_HF.exists():
        pytest.fail(f"test model missing: {STORIES_HF} (it ships in the repository: is the checkout complete?)")
    return str(STORIES_HF)
