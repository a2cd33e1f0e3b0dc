"""Runs one credit computation (TASPO's, or a registered method's such as GiGPO) on a fixed group and writes the
gathered per-turn weights, PI and per-turn advantages as JSON.

Launched by tests/trainers/test_distributed.py once with one process and once with ``accelerate launch`` on two
processes (gloo on CPU); the 4 siblings of the group are split 2 + 2 across processes in the second run.

    python tests/helpers/taspo_weights.py MODEL_DIR GAME_FILE OUT_JSON [METHOD]   # METHOD: taspo (default), gigpo, ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate.utils import gather_object
from datasets import Dataset

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.envs.alfworld import task_spec_rows
from taspo_trl.testing import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers import method_classes, method_settings


def main() -> None:
    model_dir, game_file, out = sys.argv[1], sys.argv[2], sys.argv[3]
    walkthrough = json.loads(Path(game_file).read_text())["walkthrough"]
    plans = walkthrough_plans(walkthrough, 6)
    rows = task_spec_rows([game_file])
    method = sys.argv[4] if len(sys.argv) > 4 else "taspo"
    config_class, trainer_class = method_classes(method)
    config = config_class(
        **method_settings(method),
        output_dir=str(Path(out).parent / "trainer"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=32,
        max_turns=6,
        report_to="none",
        bf16=False,
        use_cpu=True,  # on a CPU-only machine transformers only goes distributed (gloo) with use_cpu=True
        seed=0,
    )
    trainer = trainer_class(model=model_dir, args=config, train_dataset=Dataset.from_list(rows * 4))
    credit: list = []
    hook = trainer.turn_advantages
    trainer.turn_advantages = lambda step: credit.append(hook(step)) or credit[-1]
    accelerator = trainer.accelerator
    share = 4 // accelerator.num_processes
    mine = slice(accelerator.process_index * share, (accelerator.process_index + 1) * share)
    generator = PlannedGenerator(trainer.model, trainer.processing_class, plans[mine])
    grpo_module.generator_for_trainer = lambda _trainer, batch_size=None: generator
    trainer.model.train()
    trainer._generate_and_score_completions([dict(rows[0]) for _ in range(share)])
    weights = gather_object([trainer.last_step.weights])
    pi = gather_object([trainer.last_step.privileged_info])
    advantages = gather_object([credit[-1]])
    if accelerator.is_main_process:
        flat_w = [w for part in weights for w in part]
        flat_pi = [p for part in pi for p in part]
        flat_a = [a for part in advantages for a in part]
        Path(out).write_text(json.dumps({"processes": accelerator.num_processes, "weights": flat_w, "pi": flat_pi,
                                         "turn_advantages": flat_a}))
    trainer.close()
    # Leave together and take gloo down before exit: a rank that exits with the process group alive can abort
    # in gloo's threads at interpreter shutdown ("terminate called without an active exception").
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
