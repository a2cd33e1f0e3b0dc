"""The run's contract, checked before any work: the settings and the dataset give the steps that were asked for,
and a resumed run never trains past its budget.

``taspo-train`` and the agent trainers (``AgentGRPOTrainer`` and its subclasses) call these checks, so a run that
would train zero steps, or one step more than ``max_steps``, stops in one line that names the fields and the
numbers instead of exiting 0 as if it had trained.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("taspo_trl")


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


_REPORTED: set[tuple[str, str]] = set()  # skipped checkpoints already reported by this process


def resume_checkpoint(output_dir: str, resume_from_checkpoint: str | bool | None) -> Path | None:
    """The checkpoint folder a resume loads: for ``True``, the newest *complete* ``checkpoint-N`` of ``output_dir``
    (``checkpoints.save_problem`` tells complete from cut off); each newer one it skips is reported once, with
    the reason, and left where it is (the resumed run writes over it when it reaches that step). None when there
    is nothing to resume."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is not True:
        return Path(resume_from_checkpoint)
    from .checkpoints import find_resumable

    checkpoint, skipped = find_resumable(output_dir)
    for folder, problem in skipped:
        if (str(folder), problem) not in _REPORTED:
            _REPORTED.add((str(folder), problem))
            goes_on = f"resuming from {checkpoint.name}" if checkpoint else "no complete checkpoint: training from step 0"
            logger.warning(f"skipping {folder}: incomplete ({problem}); {goes_on}. It is left in place, and the run "
                           f"saves over it when it reaches step {folder.name.split('-')[1]}")
    return checkpoint


def check_resume_target(output_dir: str, resume_from_checkpoint: str | bool | None) -> None:
    """Refuse a resume with nothing to resume from before any work: transformers finds out only in ``train()``,
    after the games and the model are loaded. ``True`` over a folder whose checkpoints are all cut off trains from
    step 0 (with a warning naming them): that is where the run stands.

    Raises:
        ValueError: ``True`` with no ``checkpoint-N`` in ``output_dir``; a checkpoint path that is not a folder, or
            whose save is incomplete (naming why, and the newest complete one to resume instead).
    """
    from .checkpoints import checkpoints_newest_first, find_resumable, save_problem

    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return
    if resume_from_checkpoint is True:
        if not checkpoints_newest_first(output_dir):
            raise ValueError(
                f"resume_from_checkpoint true, but output_dir {output_dir} holds no checkpoint-N folder to resume "
                "from; drop --resume_from_checkpoint to start the run, or point --output_dir at the run to resume"
            )
        return
    folder = Path(resume_from_checkpoint)
    if not folder.is_dir():
        raise ValueError(f"resume_from_checkpoint {resume_from_checkpoint}: no such checkpoint folder")
    problem = save_problem(folder)
    if problem is not None:
        newest, _ = find_resumable(folder.parent)
        instead = f"resume from {newest}" if newest else "start the run again without --resume_from_checkpoint"
        raise ValueError(f"resume_from_checkpoint {resume_from_checkpoint} is incomplete ({problem}); {instead}, "
                         "or --resume_from_checkpoint true for the newest complete checkpoint")


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
