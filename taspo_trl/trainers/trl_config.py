"""What the agent trainers' configs (``AgentGRPOConfig``, ``AgentSFTConfig``) do to TRL's own fields in their
``__post_init__``, below both trainers so that neither imports the other."""

from __future__ import annotations

from typing import Any


def adopt_activation_checkpointing(config: Any) -> None:
    """Move a TRL config's ``gradient_checkpointing`` to ``activation_checkpointing`` before its ``__post_init__``.

    TRL defaults the deprecated alias to True, so transformers would print a FutureWarning for every config;
    setting the new name first means the same, silently."""
    if getattr(config, "activation_checkpointing", False) is None:
        config.activation_checkpointing = config.gradient_checkpointing
