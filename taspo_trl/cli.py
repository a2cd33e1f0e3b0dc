"""Command-line entry points.

    taspo-train --config alfworld_grpo_cpu [--key value ...]

``--config`` takes a YAML file or the name of a shipped recipe (``taspo-recipes list``). The YAML follows TRL's
``TrlParser`` conventions: top-level keys are fields of the script arguments (``script_args.py``), of the
method's config class (``AgentGRPOConfig`` for ``method: grpo``, ``AgentSFTConfig`` for the ``method: sft`` warm
start on expert demonstrations) and of ``trl.ModelConfig`` (model path, LoRA settings); an ``env:`` block of
environment variables is exported first (as in TRL; the environment to train in is the ``environment:`` key);
command-line flags override the file. ``--env_module my_envs`` imports a module that registers your own
environments (``taspo_trl.envs.register_env``) before the environment is looked up.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .checkpoints import (
    COMPLETE,
    SaveFailed,
    check_resume_target,
    final_model_problem,
    finished_run_message,
    hold_output_dir,
    save_final_model,
    with_checkpoint_saving,
)
from .envs import build_task_rows
from .model_card import write_model_card
from .models import check_model_reference
from .run_contract import (
    RunAlreadyFinished,
    check_generation_batch,
    check_run_settings,
    run_length_notes,
)
from .script_args import (
    SETUP_ERRORS,
    AgentScriptArguments,
    check_setting_names,
    import_env_module,
    load_yaml,
    one_line_errors,
    resolve_config_argv,
    resolve_reward_funcs,
    with_env_kwargs,
)

logger = logging.getLogger("taspo_trl")

HELP_DESCRIPTION = """Train a multi-turn agent with a credit method on TRL's GRPOTrainer (or SFT on expert demonstrations).

  taspo-train --config alfworld_taspo_cpu                  # a shipped recipe (taspo-recipes list)
  taspo-train --config my_recipe.yaml --max_steps 10       # any flag below overrides the recipe
  accelerate launch -m taspo_trl.cli --config paper/alfworld/taspo_qwen2.5-3b

--config takes a YAML file or a shipped recipe's name; its keys are the flags below. The settings listed are those
of method {method!r} ({config}); --method NAME --help lists another method's."""


def say(message: str, stream: Any = None) -> None:
    """Print a ``[taspo-train]`` line on the main process only: under ``accelerate launch`` every rank runs this
    script, and its ``RANK`` (set by the launcher) tells them apart before the trainer exists."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[taspo-train] {message}", file=stream or sys.stdout, flush=True)


def _method_config_class(method: str) -> type:
    from .trainers import method_classes, method_names
    from .trainers.sft import AgentSFTConfig

    if method == "sft":
        return AgentSFTConfig
    try:
        return method_classes(method)[0]
    except KeyError:
        known = sorted({*method_names(), "sft"})
        raise SystemExit(f"taspo-train: unknown method {method!r}; choose one of {known}.") from None


def _method_from_argv(argv: list[str]) -> str:
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--config")
    peek.add_argument("--method")
    known, _ = peek.parse_known_args(argv)
    if known.method:
        return known.method
    if known.config:
        data = load_yaml(known.config) or {}
        return str(data.get("method", "grpo"))
    return "grpo"


def build_trainer(
    argv: list[str], callbacks: list | None = None, model_override: str | None = None, reward_funcs: list | None = None
) -> Any:
    """Parse a recipe plus command-line overrides and build its dataset and trainer (no training).

    ``model_override`` replaces the recipe's model (the recipe tests build every recipe with a tiny model);
    ``reward_funcs`` are added to the environment's verified reward, which comes last in ``reward_weights``.
    """
    from datasets import Dataset
    from trl import get_peft_config

    from .trainers import method_classes
    from .warmstart import resolve_policy_path

    method, script_args, config, model_args = _parse_recipe(argv)
    _check_run_folder(config, method)
    name = model_override or model_args.model_name_or_path
    if not name:
        raise SystemExit("taspo-train: set model_name_or_path (e.g. embedded:smollm2-135m-instruct or a HF model).")
    check_model_reference(name)
    check_output_dir(config.output_dir, config.resume_from_checkpoint, script_args.overwrite_output_dir)
    check_hub_access(config)
    say(f"precision: {config.precision.description}")
    config.model_init_kwargs = _model_init_kwargs(model_args, config)
    rows = with_env_kwargs(build_task_rows(config.environment, asdict(script_args), config.max_turns),
                           script_args.env_kwargs)
    reward_funcs = [*(reward_funcs or []), *resolve_reward_funcs(script_args.reward_funcs)]
    if method != "sft":  # before the model is resolved: a warm start that is not built yet takes minutes
        check_generation_batch(config, len(rows))
    # held for the whole process, from before the model loads: a second run on this folder stops here in seconds
    hold_output_dir(config.output_dir)
    model_path = resolve_policy_path(name, bf16=config.bf16)  # a warm-start build computes as the run does
    if method == "sft":
        return _sft_trainer(rows, config, model_path, get_peft_config(model_args), callbacks)
    dataset = Dataset.from_list(rows)
    say(f"method={method} env={config.environment} tasks={len(dataset)} model={model_path}")
    return method_classes(method)[1](
        model=model_path,
        args=config,
        train_dataset=dataset,
        reward_funcs=reward_funcs,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )


def _parse_recipe(argv: list[str]) -> tuple[str, Any, Any, Any]:
    """The recipe's method and its three parsed parts (script arguments, the method's config, TRL's
    ``ModelConfig``), with the settings that select the method within its config class; the recipe's
    ``env_module`` is imported and logging set to its ``log_level``."""
    from trl import ModelConfig, TrlParser

    from .trainers import method_settings

    argv = resolve_config_argv(argv, "taspo-train")
    method = _method_from_argv(argv)
    config_class = _method_config_class(method)
    for name, value in method_settings(method).items():
        if f"--{name}" not in argv:
            argv = [*argv, f"--{name}", value]
    parser = TrlParser((AgentScriptArguments, config_class, ModelConfig), allow_abbrev=False,
                       usage="taspo-train --config RECIPE [--setting value ...]", description=HELP_DESCRIPTION.format(method=method, config=config_class.__name__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    check_setting_names(parser, argv)
    script_args, config, model_args = parser.parse_args_and_config(args=argv)
    import_env_module(script_args.env_module, "taspo-train")
    logging.basicConfig(level=logging.INFO if config.log_level in ("info", "passive") else logging.WARNING)
    return method, script_args, config, model_args


def _check_run_folder(config: Any, method: str) -> None:
    """Before anything loads: the output folder is not another live run's, a resume names a checkpoint it can
    take, and a finished run stops here (unless its final save was cut off: it is then saved again). The SFT
    method's run settings are checked here; the agent configs check theirs themselves."""
    if Path(config.output_dir).is_dir():  # a folder another run may hold: find out before anything else
        hold_output_dir(config.output_dir)
    resume = _resume_argument(config.resume_from_checkpoint)
    check_resume_target(config.output_dir, resume)
    finished = finished_run_message(config, resume)
    if finished:
        incomplete = final_model_problem(config.output_dir)
        if incomplete is None:
            raise RunAlreadyFinished(finished)
        # a re-queued job whose final save was cut off: save the final model again from the last checkpoint
        say(f"{finished.split(':')[0]}, but the final model in {config.output_dir} is incomplete ({incomplete}): "
            "saving it again from that checkpoint", stream=sys.stderr)
    if method == "sft":
        check_run_settings(config)
        for note in run_length_notes(config):
            say(f"note: {note}", stream=sys.stderr)


def _model_init_kwargs(model_args: Any, config: Any) -> dict[str, Any]:
    """As TRL's `trl grpo` script: the model settings of ModelConfig reach the model load; the recipe's own
    `model_init_kwargs` win where both set a key."""
    quantization = _quantization(model_args)
    return {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **({"quantization_config": quantization} if quantization else {}),
        **(config.model_init_kwargs or {}),
    }


def _quantization(model_args: Any) -> Any:
    """``trl.get_quantization_config`` for ``load_in_4bit``/``load_in_8bit`` (QLoRA), after the checks that
    would otherwise fail deep inside the model load."""
    from trl import get_quantization_config

    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    if not model_args.use_peft:
        raise ValueError("quantized weights can't be trained directly; add --use_peft true to train LoRA adapters (QLoRA)")
    import torch

    if not torch.cuda.is_available():
        raise ValueError("load_in_4bit/load_in_8bit need a CUDA GPU (bitsandbytes); drop them to train on this machine")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError("load_in_4bit/load_in_8bit need bitsandbytes: pip install bitsandbytes")
    return get_quantization_config(model_args)


_MODEL_FILES = (COMPLETE, "model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin")


def check_output_dir(output_dir: str, resume_from_checkpoint: str | None, overwrite: bool) -> None:
    """Refuse to train into a folder that holds checkpoints or a saved model unless the run resumes from a
    checkpoint or the user allows overwriting: a new run would silently replace them (a run with ``save_strategy
    no`` leaves only its model)."""
    if resume_from_checkpoint or overwrite:
        return
    folder = Path(output_dir)
    checkpoints = sorted(p.name for p in folder.glob("checkpoint-*") if p.is_dir()) if folder.is_dir() else []
    if checkpoints:
        raise ValueError(
            f"output_dir {output_dir} already holds {', '.join(checkpoints)}; resume with --resume_from_checkpoint "
            "true (or a checkpoint path), pick another --output_dir, or pass --overwrite_output_dir true"
        )
    model = [name for name in _MODEL_FILES if (folder / name).is_file()]
    if model:
        raise ValueError(
            f"output_dir {output_dir} already holds a saved model ({model[0]}); a new run would replace it: pick "
            "another --output_dir, or pass --overwrite_output_dir true"
        )


def check_hub_access(config: Any) -> None:
    """With ``push_to_hub``, ask the Hub who the token belongs to before any work: otherwise a missing login or
    an unreachable Hub surfaces only when the trainer creates the repository, after the model has loaded."""
    if not config.push_to_hub:
        return
    from huggingface_hub import HfApi

    try:
        HfApi().whoami(token=config.hub_token)
    except Exception as error:  # no token, offline mode, no network, bad token: all mean the push can't happen
        raise ValueError(
            f"push_to_hub needs a reachable Hugging Face Hub and a login (hf auth login, HF_TOKEN or --hub_token); "
            f"the Hub check failed: {' '.join(str(error).split()) or type(error).__name__}. Drop --push_to_hub to "
            "train locally (the model card is written to output_dir either way)"
        ) from error


def model_card_name(args: Any) -> str:
    """The model name a card and a Hub repository get, as TRL's trainers name them at a checkpoint."""
    return args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name


def _resume_argument(value: str | None) -> str | bool | None:
    """``resume_from_checkpoint`` for ``Trainer.train``: ``true``/``last`` resumes the latest checkpoint of
    output_dir, a path resumes that one."""
    if value is None or str(value).lower() in ("", "false", "none"):
        return None
    return True if str(value).lower() in ("true", "last") else value


def _sft_trainer(rows: list[dict], config: Any, model_path: str, peft_config: Any, callbacks: list | None) -> Any:
    """TRL's ``SFTTrainer`` (``AgentSFTTrainer``) on the expert demonstrations of ``rows`` (``method: sft``)."""
    from transformers import AutoTokenizer

    from .models import prepare_tokenizer
    from .trainers.sft import AgentSFTTrainer, demonstration_sft_dataset

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_path))
    tokenizer.padding_side = "right"  # training pads on the right
    dataset = demonstration_sft_dataset(rows, tokenizer, config)
    say(f"method=sft env={config.environment} tasks={len(rows)} demonstration turns={len(dataset)} model={model_path}")
    return with_checkpoint_saving(AgentSFTTrainer)(  # complete-marked checkpoints, the lock (sft.py stays as it is)
        model=model_path, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
        callbacks=callbacks,
    )


def _write_final_model(trainer: Any) -> None:
    trainer.save_model(trainer.args.output_dir)
    trainer.save_state()  # trainer_state.json: the log history `taspo-report curves` reads
    # README.md naming the base model, the method and its paper, for the RL methods and the SFT warm start alike
    # (TRL writes one only at checkpoints, and a run may save none)
    write_model_card(trainer, trainer.args.output_dir, model_name=model_card_name(trainer.args))


def train_main(argv: list[str] | None = None) -> None:
    """``taspo-train``: parse the recipe, build the dataset and trainer, train, save."""
    from .trainers.progress import ProgressPrinter

    argv, fail = one_line_errors("taspo-train", list(sys.argv[1:] if argv is None else argv))
    try:
        trainer = build_trainer(argv, callbacks=[ProgressPrinter()])
    except RunAlreadyFinished as finished:  # a re-queued finished job: exit 0, and leave its output alone
        say(str(finished))
        return
    except SETUP_ERRORS as error:
        fail(error)
    resume = _resume_argument(trainer.args.resume_from_checkpoint)
    try:
        try:  # before the first rollout: free space for a checkpoint, and a checkpoint this run can resume
            trainer.check_run_start(resume)
        except SETUP_ERRORS as error:
            fail(error)
        trainer.train(resume_from_checkpoint=resume)
    except SaveFailed as error:  # a full disk: one line naming the folder, the free space and the rerun
        fail(error)
    finally:
        if hasattr(trainer, "close"):  # the agent trainers' environment workers; SFTTrainer has none
            trainer.close()
    try:
        save_final_model(trainer, lambda: _write_final_model(trainer))
    except SaveFailed as error:
        fail(error)
    if trainer.args.push_to_hub:
        trainer.push_to_hub()
    say(f"done; model saved to {os.path.abspath(trainer.args.output_dir)}")


if __name__ == "__main__":
    train_main()
