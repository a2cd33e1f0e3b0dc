"""Fixtures shared by the trainer tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def snapshot(tiny_model_dir):
    """The initial weights, loaded on their own: the rollout snapshot (and every self-teacher) of step 0."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
