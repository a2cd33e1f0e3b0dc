"""The run's contract, checked before any work: the settings and the dataset give the steps that were asked for,
and a resumed run never trains past its budget.

``taspo-train`` and the agent trainers (``AgentGRPOTrainer`` and its subclasses) call these checks, so a run that
would train zero steps, or one step more than ``max_steps``, stops in one line that names the fields and the
numbers instead of exiting 0 as if it had trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunAlreadyFinished(Exception):
    """Resuming from a checkpoint that is at or past the run's budget: nothing is left to train (not an error)."""


def check_generation_batch(args: Any, num_tasks: int) -> None:
    """Refuse a dataset with fewer tasks than one generation batch needs.

    TRL's GRPO sampler yields whole generation batches only: ``generation_batch_size / num_generations`` distinct
    tasks per batch. With fewer tasks it yields nothing, and transformers stops "at step 0" and returns as if the
    run were done.

    Raises:
        ValueError: naming the tasks, the fields that make up the batch and their values, and the fixes.
    """
    needed = args.generation_batch_size // args.num_generations
    if num_tasks >= needed:
        return
    processes = args.generation_batch_size // (args.per_device_train_batch_size * args.steps_per_generation)
    steps = (
        f"gradient_accumulation_steps {args.gradient_accumulation_steps}"
        if args.steps_per_generation == args.gradient_accumulation_steps
        else f"steps_per_generation {args.steps_per_generation}"
    )
    raise ValueError(
        f"{num_tasks} tasks, but one step needs {needed} = per_device_train_batch_size "
        f"{args.per_device_train_batch_size} x {steps} x {processes} process(es) / num_generations "
        f"{args.num_generations}, and with fewer the run would train 0 steps; lower gradient_accumulation_steps or "
        "per_device_train_batch_size, or add games/tasks (games_per_type, max_tasks)"
    )


def resume_checkpoint(output_dir: str, resume_from_checkpoint: str | bool | None) -> Path | None:
    """The checkpoint folder a resume would load (``True``: the latest ``checkpoint-N`` of ``output_dir``)."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        folder = Path(output_dir)
        numbered = [(int(p.name.split("-")[1]), p) for p in folder.glob("checkpoint-*")
                    if p.is_dir() and p.name.split("-")[1].isdigit()] if folder.is_dir() else []
        return max(numbered)[1] if numbered else None
    return Path(resume_from_checkpoint)


def finished_run_message(args: Any, resume_from_checkpoint: str | bool | None) -> str | None:
    """Why resuming from ``resume_from_checkpoint`` has nothing left to train, or None when it has.

    transformers' loop resumed at ``global_step == max_steps`` still trains one step (and saves ``checkpoint-N+1``)
    before it checks the budget, so a finished job re-queued by a scheduler would grow by a step every time. An
    epoch-based run (``max_steps <= 0``) is finished when the checkpoint reached its own ``max_steps`` and
    ``num_train_epochs`` has not been raised since."""
    checkpoint = resume_checkpoint(args.output_dir, resume_from_checkpoint)
    if checkpoint is None:
        return None
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        step = int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not a trainer checkpoint: transformers' own resume says what is wrong
    if args.max_steps > 0:
        if step < args.max_steps:
            return None
        budget = f"max_steps {args.max_steps}"
    else:
        if step < int(state.get("max_steps") or 0) or float(args.num_train_epochs) > float(state.get("num_train_epochs") or 0):
            return None
        budget = f"num_train_epochs {args.num_train_epochs:g}"
    return (
        f"{checkpoint.name} in {checkpoint.parent} is at step {step}, which already meets {budget}: the run is "
        "already finished, nothing to train (raise max_steps or num_train_epochs to train further)"
    )
