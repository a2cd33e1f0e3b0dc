"""One training step of AgentGRPOTrainer on scripted locker rollouts, twice: with TRL's own micro-batches and
with the trainer's repacked ones (zero-advantage rows skipped). Records the accumulated gradient just before
the optimizer step and the shape of every micro-batch the loss saw.

Every task is the same locker game (the key is in locker 1, 3 turns), so each process's share of the batch is
fixed whatever order the sampler draws tasks in. Process 0 holds one group with two wins and two failures
(nonzero advantages) and one group of four failures (advantages all 0); any further process holds only
failing groups, so with two processes one of them runs placeholder micro-batches only.

Imported by tests/trainers/test_packing.py; launched with ``accelerate launch`` on two processes by the same
test, when it writes the gradients of both runs to OUT (a torch file):

    python tests/helpers/step_gradients.py MODEL_DIR LAYOUT OUT
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOTrainer

# This checkout's package and its tests.helpers (the shared CPU trainer settings, the toy environments), whatever
# the working directory of the launch.
sys.path[:0] = [str(Path(__file__).resolve().parents[2])]

import taspo_trl.trainers.grpo as grpo_module  # noqa: E402
from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt  # noqa: E402
from taspo_trl.testing import PlannedGenerator  # noqa: E402
from tests.helpers.cpu_config import cpu_trainer_kwargs  # noqa: E402
from tests.helpers.toy_envs import locker_factory  # noqa: E402

WIN_NOW = ["open locker 1"]
WIN_LATE = ["open locker 2", "open locker 1"]
FAIL = ["open locker 2", "open locker 3", None]
FAIL_OTHER = ["open locker 4", "look", "open locker 5"]
MIXED_GROUP = [WIN_NOW, WIN_LATE, FAIL, FAIL_OTHER]
FAILED_GROUP = [FAIL, FAIL_OTHER, FAIL_OTHER, FAIL]


def process_plans(process_index: int) -> list[list[str | None]]:
    return MIXED_GROUP + FAILED_GROUP if process_index == 0 else FAILED_GROUP + FAILED_GROUP


class _GradientRecorder(TrainerCallback):
    def __init__(self) -> None:
        self.gradients: dict[str, torch.Tensor] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradients = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class _ShapeRecorder:
    """Mixin: records (rows, prompt width, completion width) of each micro-batch the loss is computed on."""

    shapes: list[tuple[int, int, int]]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.shapes.append((inputs["prompt_ids"].size(0), inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class Packed(_ShapeRecorder, AgentGRPOTrainer):
    pass


class TRLBatches(_ShapeRecorder, AgentGRPOTrainer):
    """TRL's micro-batches as they come: every row, padded to the generation batch's widths."""

    _prepare_inputs = GRPOTrainer._prepare_inputs


def step_gradients(model_dir: str, layout: str, output_dir: str | Path, trl_batches: bool) -> dict[str, Any]:
    """Gradients of one optimizer step (4 micro-batches of 2 trajectories per process), the micro-batch
    shapes, the trajectories of this process and the logged metrics."""
    config = AgentGRPOConfig(
        **cpu_trainer_kwargs(
            output_dir, layout=layout, per_device_train_batch_size=2, gradient_accumulation_steps=4,
            max_turns=3, max_completion_length=32, max_grad_norm=0.0,  # no clipping: compare raw gradients
        )
    )
    rows = Dataset.from_list([{"prompt": encode_task_prompt({"target": 1, "max_turns": 3})}] * 4)
    recorder = _GradientRecorder()
    trainer_class = TRLBatches if trl_batches else Packed
    trainer = trainer_class(model=model_dir, args=config, train_dataset=rows, env_factory=locker_factory, callbacks=[recorder])
    trainer.shapes = []
    plans = process_plans(trainer.accelerator.process_index)
    generator = PlannedGenerator(trainer.model, trainer.processing_class, plans)
    original = grpo_module.generator_for_trainer
    grpo_module.generator_for_trainer = lambda _trainer, batch_size=None: generator
    try:
        trainer.train()
    finally:
        grpo_module.generator_for_trainer = original
        trainer.close()
    return {
        "gradients": recorder.gradients,
        "shapes": trainer.shapes,
        "trajectories": trainer.last_step.trajectories,
        "logs": trainer.state.log_history[0],
        "processes": trainer.accelerator.num_processes,
        "is_main": trainer.accelerator.is_main_process,
    }


def main() -> None:
    model_dir, layout, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    runs = {name: step_gradients(model_dir, layout, out.parent / name, trl_batches=name == "trl") for name in ("trl", "packed")}
    if runs["trl"]["is_main"]:
        torch.save(
            {name: {k: run[k] for k in ("gradients", "shapes", "logs", "processes")} for name, run in runs.items()}, out
        )


if __name__ == "__main__":
    main()
