"""Warm-started embedded policies: the embedded model after a short SFT pass on expert demonstrations.

``embedded:smollm2-135m-alfworld`` names SmolLM2-135M-Instruct fine-tuned (with TRL's ``SFTTrainer``) on the
planner walkthroughs of generated ALFWorld train games, rendered in the quickstart recipes' prompts (``turn``
layout, history window 1). The base model never writes a valid action; the warm-started one does, and wins
some games, so RL groups hold both successes and failures.

It is built on first use, like the GGUF conversion of the base model, into the model cache
(``$TASPO_TRL_CACHE/models``): a progress bar while it trains, an atomic rename when it is done, and a
fingerprint file that makes a later use rebuild it when its settings, the code that produces its data, or the
library versions change, and a manifest (``cache_manifest``) that makes it rebuild, with a warning, when a file
of it is cut off or changed. Concurrent first uses (the ranks of one launch) wait on a lock while one builds.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .cache_manifest import adopt_or_check, write_manifest
from .models import EMBEDDED_MODEL, cache_root, owned_temporary_dir, resolve_model_path

_FINGERPRINT_FILE = "warm_start.json"
# Modules whose code decides the demonstrations (games, expert, prompts, privileged contexts) and so the weights.
_DATA_MODULES = (
    "envs/alfworld/generator.py",
    "envs/alfworld/env.py",
    "envs/alfworld/expert.py",
    "envs/base.py",
    "privileged/analyzers.py",
    "privileged/builder.py",
    "privileged/protocol.py",
    "privileged/rescoring.py",
    "rollout/chat.py",
    "rollout/demonstrations.py",
    "rollout/loop.py",
    "trainers/sft.py",
)
# Bump when ``train_warm_start`` changes how it trains (its settings beyond ``WarmStart``'s fields).
_BUILD_VERSION = 2
_VERSIONED_PACKAGES = ("torch", "transformers", "trl", "textworld", "alfworld")


@dataclass(frozen=True)
class WarmStart:
    """How one warm-started policy is built (every field enters its fingerprint)."""

    environment: str
    base_model: str
    games_per_type: int
    games_seed: int
    layout: str
    history_window: int
    num_train_epochs: float
    learning_rate: float
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    seed: int
    task_types: tuple[str, ...] | None = None
    """ALFWorld families to generate games for (``None``: all six)."""
    demonstrations_per_task: int = 1
    """Expert episodes per game (``AgentSFTConfig.demonstrations_per_task``)."""
    pi_episodes: int = 0
    """Of those, informed episodes with the privileged context in the prompt
    (``AgentSFTConfig.demonstration_pi_episodes``)."""
    pi_games_per_type: int = 0
    """More train games per family (generated with seed ``games_seed + 1``) that the SFT sees only as one informed
    episode each with the privileged context in every prompt (``taspo_trl.trainers.sft.guided_sft_dataset``)."""
    mistake_rate: float = 0.0
    """Per-turn probability of an injected repeat (``AgentSFTConfig.demonstration_mistake_rate``)."""
    wander_rate: float = 0.0
    """Per-turn probability of an injected random command (``AgentSFTConfig.demonstration_wander_rate``)."""
    frozen_layers: int = 0
    """Lowest decoder layers kept fixed, with the embeddings (``AgentSFTConfig.frozen_layers``)."""
    relabel_episodes_per_task: int = 0
    """DAgger: sampled episodes per game of the SFT policy, whose expert corrections train a second round
    (``taspo_trl.trainers.sft.relabelled_sft_dataset``); 0 = no second round."""
    relabel_max_turns: int = 12
    """Turn cap of those episodes (the quickstarts' ``max_turns``)."""
    relabel_max_new_tokens: int = 48
    """Response length of those episodes (the quickstarts' ``max_completion_length``)."""
    relabel_epochs: float = 1.0
    """Epochs of the second round over the demonstrations and the corrections together."""
    relabel_learning_rate: float = 1e-4
    """Peak learning rate of the second round."""
    bf16: bool = False
    """Train under bf16 autocast (float32 weights, bfloat16 matmuls): about 1.6x faster SFT steps on a CPU with
    bfloat16 instructions (AVX512-BF16 or AMX; ``benchmarks/cpu_precision.py``), slower on one without."""


WARM_STARTS: dict[str, WarmStart] = {
    "embedded:smollm2-135m-alfworld": WarmStart(
        environment="alfworld",
        base_model=EMBEDDED_MODEL,
        games_per_type=1,
        games_seed=0,
        layout="turn",
        history_window=1,
        num_train_epochs=4,
        learning_rate=2e-4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        seed=0,
        # Three searching episodes per game, and one informed episode with TASPO's privileged context in every
        # prompt, so the policy learns to act on P_i and the privileged pass moves the actions P_i names.
        demonstrations_per_task=4,
        pi_episodes=1,
        mistake_rate=0.15,
        # Half the layers fixed (1.5x faster steps) and bf16 autocast (1.6x faster again on a CPU with bfloat16
        # instructions) buy the fourth epoch within the 10-minute build.
        frozen_layers=15,
        bf16=True,
    ),
}


def is_warm_start(name: str) -> bool:
    return name.strip().lower() in WARM_STARTS


def warm_start_dir(name: str) -> Path:
    return cache_root() / "models" / name.strip().lower().split(":", 1)[1]


def fingerprint(spec: WarmStart) -> dict[str, object]:
    """What the built weights depend on: the settings, the data-producing code and the library versions."""
    package = Path(__file__).parent
    code = hashlib.sha256()
    for module in _DATA_MODULES:
        code.update(module.encode() + (package / module).read_bytes())
    versions = {}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    # Through JSON, so it compares equal to the copy read back from the fingerprint file (tuples become lists).
    return json.loads(json.dumps({"settings": asdict(spec), "build_version": _BUILD_VERSION, "code_sha256": code.hexdigest(), "versions": versions}))


def trained_history_window(model_dir: str) -> int:
    """The turn-layout history window a warm start in ``model_dir`` was trained with (its prompts must match), read
    from its ``warm_start.json``; 1 for any other model, as in the quickstarts."""
    record = Path(model_dir) / _FINGERPRINT_FILE
    if not record.is_file():
        return 1
    return int(json.loads(record.read_text())["fingerprint"]["settings"]["history_window"])


def resolve_policy_path(name_or_path: str) -> str:
    """Like ``taspo_trl.models.resolve_model_path``, and also for the warm starts of ``WARM_STARTS`` (built first
    when missing or out of date). The CLI, ``taspo-eval`` and the benchmarks resolve policy names through it."""
    return resolve_warm_start(name_or_path) if is_warm_start(name_or_path) else resolve_model_path(name_or_path)


def resolve_warm_start(name: str) -> str:
    """The model directory of warm start ``name``, built first if it is missing or out of date."""
    spec = WARM_STARTS[name.strip().lower()]
    target = warm_start_dir(name)
    wanted = fingerprint(spec)
    if _current(target, wanted) and adopt_or_check(target) is None:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it; wait, then look again
        if not _current(target, wanted):
            _build(name, spec, target, wanted)
        elif problem := adopt_or_check(target):  # up to date, but a file of it was cut off or changed
            print(f"taspo_trl: warning: the warm start {name} is damaged ({problem}); rebuilding it", file=sys.stderr,
                  flush=True)
            _build(name, spec, target, wanted)
    return str(target)


def _current(target: Path, wanted: dict[str, object]) -> bool:
    try:
        return json.loads((target / _FINGERPRINT_FILE).read_text())["fingerprint"] == wanted
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build(name: str, spec: WarmStart, target: Path, wanted: dict[str, object]) -> None:
    """Train into a temporary sibling directory, then swap it into place with renames."""
    print(
        f"taspo_trl: building the warm-started policy {name} in {target} (one-time: SFT of {spec.base_model} on "
        f"expert demonstrations, 8 to 10 minutes on a 2-core CPU with bfloat16 instructions)",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    work = owned_temporary_dir(target)
    try:
        model_dir = work / "model"
        examples = train_warm_start(spec, model_dir, work / "games")
        seconds = time.perf_counter() - started
        record = {"name": name, "fingerprint": wanted, "examples": examples, "build_seconds": round(seconds, 1)}
        (model_dir / _FINGERPRINT_FILE).write_text(json.dumps(record, indent=2))
        write_manifest(model_dir)
        model_dir.chmod(0o755)
        stale = owned_temporary_dir(target, kind="stale")
        stale.rmdir()  # only its owner-tagged name is wanted: the old target is renamed onto it
        if target.exists():
            os.rename(target, stale)
        os.rename(model_dir, target)
        shutil.rmtree(stale, ignore_errors=True)
        print(f"taspo_trl: {name} built in {seconds:.0f}s from {examples} demonstration turns", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def train_warm_start(spec: WarmStart, out_dir: Path, games_dir: Path) -> int:
    """SFT of ``spec.base_model`` on the expert's demonstrations, then, with ``spec.relabel_episodes_per_task``,
    a DAgger round on the expert's corrections of the SFT policy's own episodes; saves model and tokenizer to
    ``out_dir`` and returns the number of training rows (demonstration turns and corrections)."""
    import torch
    from datasets import concatenate_datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .envs.alfworld import generate_games, task_spec_rows
    from .models import prepare_tokenizer
    from .trainers.sft import (
        AgentSFTConfig,
        AgentSFTTrainer,
        demonstration_sft_dataset,
        guided_sft_dataset,
        relabelled_sft_dataset,
    )

    base = resolve_model_path(spec.base_model)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(base))
    tokenizer.padding_side = "right"  # training pads on the right; generation sets its own side
    task_types = list(spec.task_types) if spec.task_types else None
    files = generate_games(games_dir, spec.games_per_type, spec.games_seed, "train", task_types=task_types)
    settings = dict(
        output_dir=str(out_dir.parent / "sft"),
        environment=spec.environment,
        layout=spec.layout,
        history_window=spec.history_window,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        per_device_train_batch_size=spec.per_device_train_batch_size,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        # Rows with the privileged context are ~170 tokens longer; in random batches most batches would hold one
        # and pad every other row to it. Grouping by length (within random groups of a few steps) avoids that.
        train_sampling_strategy="group_by_length",
        max_length=None,
        activation_checkpointing=False,  # TRL turns it on; a 135M model fits without, and it costs a third more compute
        seed=spec.seed,
        demonstrations_per_task=spec.demonstrations_per_task,
        demonstration_pi_episodes=spec.pi_episodes,
        demonstration_mistake_rate=spec.mistake_rate,
        demonstration_wander_rate=spec.wander_rate,
        frozen_layers=spec.frozen_layers,
        use_cpu=not torch.cuda.is_available(),
        bf16=spec.bf16,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
    )
    config = AgentSFTConfig(**settings, num_train_epochs=spec.num_train_epochs, learning_rate=spec.learning_rate)
    rows = task_spec_rows(files)
    dataset = demonstration_sft_dataset(rows, tokenizer, config)
    if spec.pi_games_per_type:
        guided_games = generate_games(games_dir / "guided", spec.pi_games_per_type, spec.games_seed + 1, "train",
                                      task_types=task_types)
        guided = guided_sft_dataset(task_spec_rows(guided_games), tokenizer, config)
        dataset = concatenate_datasets([dataset, guided]).shuffle(seed=spec.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    trainer = AgentSFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    examples = len(dataset)
    if spec.relabel_episodes_per_task:
        print(f"taspo_trl: DAgger round: {spec.relabel_episodes_per_task} sampled episodes per game, relabelled by the "
              "expert", file=sys.stderr, flush=True)
        corrections = relabelled_sft_dataset(
            trainer.model, tokenizer, rows, config, episodes_per_task=spec.relabel_episodes_per_task,
            max_turns=spec.relabel_max_turns, max_new_tokens=spec.relabel_max_new_tokens, seed=spec.seed,
        )
        second = AgentSFTConfig(**settings, num_train_epochs=spec.relabel_epochs, learning_rate=spec.relabel_learning_rate)
        combined = concatenate_datasets([dataset, corrections]).shuffle(seed=spec.seed)
        trainer = AgentSFTTrainer(model=trainer.model, args=second, train_dataset=combined, processing_class=tokenizer)
        trainer.train()
        examples += len(corrections)
    tokenizer.padding_side = "left"
    trainer.model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return examples
