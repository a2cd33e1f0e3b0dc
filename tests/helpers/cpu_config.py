"""The trainer settings every CPU trainer test shares: one short step, float32, nothing written or reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_trainer_kwargs(output_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for any of the package's configs; ``overrides`` win."""
    values: dict[str, Any] = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=32,
        max_steps=1,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 autocast, which is neither exact nor fast on a CPU
        gradient_checkpointing=False,
        seed=0,
    )
    values.update(overrides)
    return values
