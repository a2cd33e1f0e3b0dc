"""The run's contract, checked before any work: the settings and the dataset give the steps that were asked for
(that a resumed run never trains past its budget is checked with its checkpoint: ``checkpoints.finished_run_message``).

``taspo-train`` and the agent trainers (``AgentGRPOTrainer`` and its subclasses) call these checks, so a run that
would train zero steps, or one step more than ``max_steps``, stops in one line that names the fields and the
numbers instead of exiting 0 as if it had trained.
"""

from __future__ import annotations

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


_DEFAULT_EPOCHS = 3.0  # transformers.TrainingArguments.num_train_epochs


def check_run_settings(args: Any) -> None:
    """Refuse a budget that trains no step or more than was asked, and a save setting that never saves.

    Raises:
        ValueError: ``max_steps 0`` (transformers reads it as unset and trains ``num_train_epochs`` epochs);
            ``num_train_epochs <= 0`` without a positive ``max_steps`` (0 steps); ``save_strategy best`` without
            evaluation (it saves only after an evaluation that finds a new best, so never).
    """
    if args.max_steps == 0:
        raise ValueError(
            f"max_steps 0 does not mean no training: transformers then trains num_train_epochs "
            f"({args.num_train_epochs:g}) epochs; set max_steps to the number of optimizer steps, or -1 to train "
            "num_train_epochs epochs"
        )
    if args.max_steps < 0 and args.num_train_epochs <= 0:
        raise ValueError(
            f"num_train_epochs {args.num_train_epochs:g} with max_steps {args.max_steps} trains 0 steps; set "
            "num_train_epochs above 0, or max_steps to the number of optimizer steps"
        )
    if args.save_strategy == "best" and args.eval_strategy == "no":
        raise ValueError(
            "save_strategy best saves a checkpoint only after an evaluation finds a new best, and eval_strategy is "
            "no: the run would save none; use save_strategy steps (with save_steps) or epoch"
        )


def run_length_notes(args: Any) -> list[str]:
    """What the run will do differently from what a setting may have meant: ``max_steps`` wins over a
    ``num_train_epochs`` other than transformers' default (an SFT recipe's epochs, say, with ``--max_steps``)."""
    if args.max_steps > 0 and float(args.num_train_epochs) != _DEFAULT_EPOCHS:
        return [
            f"max_steps {args.max_steps} overrides num_train_epochs {args.num_train_epochs:g}: the run trains "
            f"{args.max_steps} optimizer steps, however many epochs that is (max_steps -1 trains by epochs)"
        ]
    return []
