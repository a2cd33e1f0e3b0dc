"""Warm-started embedded policies: the embedded model after a short SFT pass on expert demonstrations.

``embedded:smollm2-135m-alfworld`` names SmolLM2-135M-Instruct with a rank-64 LoRA adapter on the upper 15 of its
30 layers, trained with TRL's ``SFTTrainer`` on the expert's episodes of 240 generated ALFWorld train games, rendered
in the quickstart recipes' prompts (``turn`` layout, history window 1): per game a searching episode and an informed
one with TASPO's privileged context in front of every prompt, half the searching episodes shown another task's
context to ignore, and the informed expert's corrections of the searching episodes with the task's own context (the
states where only the context says where the object is). The base model never writes a valid action; the warm-started one does, and wins some games, so
RL groups hold both successes and failures.

The package ships the adapter (``data/warm_starts/``, float16 factors and the trained norms,
with a ``warm_start.json`` fingerprint of the settings and the code that produces its data;
``benchmarks/build_warm_start.py`` rebuilds it). First use merges it into the base model in the model cache
(``$TASPO_TRL_CACHE/models``), in seconds. Where the shipped fingerprint does not match (changed settings or data
code), first use builds it instead: a progress bar while it trains, in the precision the hardware computes
fastest unless the caller says otherwise. Either way an atomic rename puts it in place, with the fingerprint file
that makes a later use reinstall or rebuild it when that changes, and a manifest (``cache_manifest``) that makes
it rebuild, with a warning, when a file of it is cut off or changed. Concurrent first uses (the ranks of one
launch) wait on a lock while one builds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .cache_manifest import adopt_or_check, write_manifest
from .models import (
    EMBEDDED_MODEL,
    cache_root,
    is_adapter_folder,
    merge_adapter,
    merged_adapter_model,
    owned_temporary_dir,
    resolve_embedded,
)
from .precision import Precision, choose_precision
from .provenance import package_versions

_FINGERPRINT_FILE = "warm_start.json"
_ADAPTER_FILE = "adapter_model.safetensors"
_SHIPPED = Path(__file__).parent / "data" / "warm_starts"
# Modules whose code decides the demonstrations (games, expert, prompts, privileged contexts) and so the weights.
_DATA_MODULES = (
    "envs/alfworld/analysis.py",
    "envs/alfworld/generator.py",
    "envs/alfworld/env.py",
    "envs/alfworld/expert.py",
    "envs/analysis.py",
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
_BUILD_VERSION = 4
# A seed whose ALFWorld train games no warm start here trained on (they use games_seed 0 and 1): the quickstarts
# and the evaluation of a warm start on train games play these, so RL starts on games the policy never saw.
FRESH_GAMES_SEED = 1000
# The linear layers of a decoder block of the Llama-style models the warm starts build on (SmolLM2).
_BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
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
    pi_corrections: bool = False
    """Also train on the informed expert's corrections of the plain episodes, with the task's own privileged context
    in the prompt (``AgentSFTConfig.demonstration_pi_corrections``): the states where only the context says where
    to go."""
    foreign_pi_share: float = 0.0
    """Share of the plain episodes shown another task's privileged context, to be ignored
    (``AgentSFTConfig.demonstration_foreign_pi_share``)."""
    mistake_rate: float = 0.0
    """Per-turn probability of an injected repeat (``AgentSFTConfig.demonstration_mistake_rate``)."""
    wander_rate: float = 0.0
    """Per-turn probability of an injected random command (``AgentSFTConfig.demonstration_wander_rate``)."""
    stall_rate: float = 0.0
    """Per-turn probability of an injected command that changes nothing, such as ALFWorld's ``look``
    (``AgentSFTConfig.demonstration_stall_rate``)."""
    thoughtless_share: float = 0.0
    """Share of the SFT rows with a privileged context answering with an empty thought before the expert's action
    (``AgentSFTConfig.demonstration_thoughtless_share``)."""
    frozen_layers: int = 0
    """Lowest decoder layers kept fixed, with the embeddings (``AgentSFTConfig.frozen_layers``); with
    ``lora_rank``, the adapter covers only the layers above them, so a step's backward pass stops there too."""
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
    lora_rank: int = 0
    """Train a LoRA adapter of this rank (PEFT, on every linear layer of the decoder) instead of the weights
    themselves; 0 = full fine-tuning. A LoRA warm start ships in the package as its adapter."""
    lora_alpha: int = 32
    """LoRA's scale numerator: the adapter's update is ``lora_alpha / lora_rank * B @ A``."""
    delta_rank: int = 0
    """Keep a full fine-tune's update of each linear layer only up to this rank (its truncated SVD), so that it ships
    in the package as a LoRA adapter of that rank (the trained norms saved whole); 0 = keep the update as trained,
    and ship nothing. A build truncates in the same way, so a built and an installed warm start are the same
    weights."""
    heal_epochs: float = 0.0
    """With ``delta_rank``: epochs of further SFT, on the same rows, of the truncated update as a LoRA adapter of
    that rank (both factors and the norms trained), so that it recovers what the truncation lost; 0 = ship the
    truncation as it is."""
    heal_learning_rate: float = 1e-4
    """Peak learning rate of that further SFT."""

    def __post_init__(self) -> None:
        if self.lora_rank < 0 or self.delta_rank < 0:
            raise ValueError(f"lora_rank and delta_rank must be at least 0, got {self.lora_rank} and {self.delta_rank}.")
        if self.lora_rank and self.delta_rank:
            raise ValueError("delta_rank truncates a full fine-tune's update; a LoRA warm start (lora_rank > 0) ships "
                             "its adapter as trained. Set one of them to 0.")
        if self.heal_epochs and not self.delta_rank:
            raise ValueError("heal_epochs trains a truncated update further; set delta_rank > 0 or heal_epochs: 0.")

    @property
    def adapter_rank(self) -> int:
        """The rank of the adapter this warm start ships (0: it ships none and is built on first use)."""
        return self.lora_rank or self.delta_rank


WARM_STARTS: dict[str, WarmStart] = {
    "embedded:smollm2-135m-alfworld": WarmStart(
        environment="alfworld",
        base_model=EMBEDDED_MODEL,
        # 240 train games, 40 per family, so that it learns the moves rather than the rooms. The quickstarts and
        # the evaluation's fresh train games use other seeds (games_seed 1000 and up), which it never saw.
        games_per_type=40,
        games_seed=0,
        layout="turn",
        history_window=1,
        # One pass over the rows (about 500 steps of 8): 1.5 passes would take the CPU build past its 100 minutes.
        num_train_epochs=1.0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        seed=0,
        # Per game one searching episode and one informed episode with TASPO's privileged context P_i in every
        # prompt (from the searching sibling, as the trainer builds it), so the policy learns to act on P_i; half
        # the searching episodes carry another task's P_i instead, so it learns to ignore guidance that does not
        # fit its task.
        demonstrations_per_task=2,
        pi_episodes=1,
        # The informed episode needs P_i only for its first move to the object's place; the informed expert's
        # corrections of the searching episode add the states where the searcher heads elsewhere, with P_i and
        # "go to" the place it quotes as target (about 2 rows a game), so the target there comes from P_i alone.
        pi_corrections=True,
        foreign_pi_share=0.5,
        mistake_rate=0.15,
        # A policy that stalls (look, inventory) and then sees an unchanged observation repeats the stall unless
        # its data show what follows one: a tenth of the turns stall and the expert goes on from there.
        stall_rate=0.1,
        # The expert's thoughts name the command they lead to, so a policy trained on them alone chooses in the
        # thought and its action tokens follow a prior after any other thought; TASPO's Eq. 3 credit for a command
        # lands on those action tokens. Half the rows answer with an empty thought, so the action itself chooses.
        thoughtless_share=0.5,
        # A rank-64 LoRA adapter on the upper 15 of the 30 layers: 19.6 MB of float16 (the wheel's 20 MB budget),
        # and the backward pass stops at layer 15 (1.5x faster steps). Trained as an adapter from the start, it
        # needs neither the truncation nor the healing epochs of a full fine-tune.
        frozen_layers=15,
        lora_rank=64,
        lora_alpha=128,
        learning_rate=5e-4,
    ),
}


def is_warm_start(name: str) -> bool:
    return name.strip().lower() in WARM_STARTS


def warm_start_dir(name: str) -> Path:
    return cache_root() / "models" / name.strip().lower().split(":", 1)[1]


def shipped_warm_start_dir(name: str) -> Path:
    """Where the package ships the adapter of warm start ``name`` (rebuilt by ``benchmarks/build_warm_start.py``)."""
    return _SHIPPED / name.strip().lower().split(":", 1)[1]


def fingerprint(spec: WarmStart) -> dict[str, object]:
    """What the trained weights depend on: the settings, the build's version and the data-producing code. The
    library versions and the precision of a build are recorded next to it (``built_with``), not compared: a
    shipped adapter stays valid under the user's versions, and a build's precision changes its rounding only."""
    package = Path(__file__).parent
    code = hashlib.sha256()
    for module in _DATA_MODULES:
        code.update(module.encode() + (package / module).read_bytes())
    # Through JSON, so it compares equal to the copy read back from the fingerprint file (tuples become lists).
    return json.loads(json.dumps({"settings": asdict(spec), "build_version": _BUILD_VERSION, "code_sha256": code.hexdigest()}))


def build_environment(bf16: bool) -> dict[str, object]:
    """The library versions, precision and thread count a build ran with (its ``built_with`` record)."""
    import torch

    return {"versions": package_versions(_VERSIONED_PACKAGES), "bf16": bf16, "torch_threads": torch.get_num_threads()}


def trained_history_window(model_dir: str) -> int:
    """The turn-layout history window a warm start in ``model_dir`` was trained with (its prompts must match), read
    from its ``warm_start.json``; 1 for any other model, as in the quickstarts."""
    record = Path(model_dir) / _FINGERPRINT_FILE
    if not record.is_file():
        return 1
    return int(json.loads(record.read_text())["fingerprint"]["settings"]["history_window"])


def resolve_policy_path(name_or_path: str, bf16: bool | None = None) -> str:
    """A path or hub id that ``from_pretrained`` loads, for every model name the package takes: the package's one
    resolver of model names. The CLI, ``taspo-eval``, the trainers, the benchmarks and the tests resolve through it.

    - a warm start of ``WARM_STARTS`` (``embedded:smollm2-135m-alfworld``): its model directory, installed from the
      package or built when missing or out of date (``resolve_warm_start``; ``bf16`` is the build's precision,
      ``None``: the hardware's);
    - a LoRA adapter folder (a LoRA run's output): its base model with the adapter merged in, made once in the cache
      (``taspo_trl.models.merged_adapter_model``);
    - the embedded policy (``embedded``, ``embedded:smollm2-135m-instruct``): its converted model directory
      (``taspo_trl.models.resolve_embedded``);
    - anything else (a hub id, a local path): unchanged.
    """
    if is_warm_start(name_or_path):
        return resolve_warm_start(name_or_path, bf16)
    if is_adapter_folder(name_or_path):
        return merged_adapter_model(name_or_path)
    return resolve_embedded(name_or_path)


def resolve_warm_start(name: str, bf16: bool | None = None) -> str:
    """The model directory of warm start ``name``. When it is missing or out of date: the base model with the
    package's shipped adapter merged in, where that adapter's fingerprint matches (seconds); otherwise a build,
    under bf16 autocast if ``bf16`` (``None``: where the hardware computes bf16, ``taspo_trl.precision``)."""
    spec = WARM_STARTS[name.strip().lower()]
    target = warm_start_dir(name)
    wanted = fingerprint(spec)
    if _current(target, wanted) and adopt_or_check(target) is None:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it; wait, then look again
        problem = adopt_or_check(target) if _current(target, wanted) else "missing or out of date"
        if problem:  # checked again under the lock: another process may have built it meanwhile
            if _current(target, wanted):
                print(f"taspo_trl: warning: the warm start {name} is damaged ({problem}); rebuilding it",
                      file=sys.stderr, flush=True)
            shipped = shipped_warm_start_dir(name)
            if _current(shipped, wanted):
                _install_shipped(name, spec, shipped, target)
            else:
                import torch

                precision = choose_precision(bf16, use_cpu=not torch.cuda.is_available())
                _build(name, spec, target, wanted, precision)
    return str(target)


def _current(target: Path, wanted: dict[str, object]) -> bool:
    try:
        return json.loads((target / _FINGERPRINT_FILE).read_text())["fingerprint"] == wanted
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _install_shipped(name: str, spec: WarmStart, shipped: Path, target: Path) -> None:
    """Merge the package's adapter into the base model, into a temporary sibling, then swap it into place."""
    print(f"taspo_trl: installing the shipped warm start {name} in {target} (one-time: its adapter merged "
          f"into {spec.base_model}, seconds)", file=sys.stderr, flush=True)
    work = owned_temporary_dir(target)
    try:
        merge_adapter(spec.base_model, shipped, work / "model")
        record = json.loads((shipped / _FINGERPRINT_FILE).read_text())
        _swap_into_place(work / "model", target, {**record, "installed_from": "package"})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build(name: str, spec: WarmStart, target: Path, wanted: dict[str, object], precision: Precision) -> None:
    """Train into a temporary sibling directory, then swap it into place with renames."""
    print(
        f"taspo_trl: building the warm-started policy {name} in {target} (one-time: SFT of {spec.base_model} on "
        f"expert demonstrations in {precision.description}; on a 2-core CPU about two hours with bfloat16 "
        "instructions, longer in float32)",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    work = owned_temporary_dir(target)
    try:
        model_dir = work / "model"
        examples, rows_hash = train_warm_start(spec, model_dir, work / "games", bf16=precision.bf16)
        seconds = time.perf_counter() - started
        record = {"name": name, "fingerprint": wanted, "examples": examples, "build_seconds": round(seconds, 1),
                  "built_with": build_environment(precision.bf16), "data_sha256": rows_hash}
        _swap_into_place(model_dir, target, record)
        print(f"taspo_trl: {name} built in {seconds:.0f}s from {examples} demonstration turns", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _swap_into_place(model_dir: Path, target: Path, record: dict[str, object]) -> None:
    """Write ``record`` as the fingerprint file of ``model_dir`` and rename it onto ``target``."""
    (model_dir / _FINGERPRINT_FILE).write_text(json.dumps(record, indent=2))
    write_manifest(model_dir)
    model_dir.chmod(0o755)
    stale = owned_temporary_dir(target, kind="stale")
    stale.rmdir()  # only its owner-tagged name is wanted: the old target is renamed onto it
    if target.exists():
        os.rename(target, stale)
    os.rename(model_dir, target)
    shutil.rmtree(stale, ignore_errors=True)


def save_adapter(model: Any, base_model: str, adapter_dir: Path) -> None:
    """Save a PEFT model's LoRA weights in float16 (half the size; the rounding moves a merged weight by about
    1e-3 of the adapter's own update), the whole modules it saves (trained norms) in float32, and its adapter
    config naming ``base_model``, not a local path."""
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    adapter_dir.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to(torch.float16 if "lora_" in key else torch.float32).contiguous()
             for key, value in get_peft_model_state_dict(model).items()}
    save_file(state, str(adapter_dir / _ADAPTER_FILE), metadata={"format": "pt"})
    config = model.peft_config["default"]
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(adapter_dir))


class TrainedWarmStart(NamedTuple):
    """What a build trained on: its number of training rows and the ``data_sha256`` of its first SFT rows."""

    examples: int
    data_sha256: str


def train_warm_start(
    spec: WarmStart, out_dir: Path, games_dir: Path, bf16: bool = False, adapter_dir: Path | None = None
) -> TrainedWarmStart:
    """SFT of ``spec.base_model`` on the expert's demonstrations (under bf16 autocast if ``bf16``), then, with
    ``spec.relabel_episodes_per_task``, a DAgger round on the expert's corrections of the SFT policy's own
    episodes; with ``spec.delta_rank``, the update of each linear layer truncated to that rank
    (``low_rank_update_adapter``) and, with ``spec.heal_epochs``, trained further as that adapter. Saves model and
    tokenizer to ``out_dir`` (with an adapter: the base model with the adapter, saved to ``adapter_dir``, default
    ``out_dir``'s sibling ``adapter``, merged in) and returns the number of training rows (demonstration turns and
    corrections) with the hash of the demonstration rows it trained on (what ``data_sha256`` replays to check)."""
    import torch
    from datasets import concatenate_datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import prepare_tokenizer
    from .trainers.sft import AgentSFTConfig, AgentSFTTrainer, relabelled_sft_dataset

    base = resolve_policy_path(spec.base_model)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(base))
    tokenizer.padding_side = "right"  # training pads on the right; generation sets its own side
    settings = _sft_settings(spec, out_dir.parent / "sft", bf16)
    config = AgentSFTConfig(**settings, num_train_epochs=spec.num_train_epochs, learning_rate=spec.learning_rate)
    dataset, rows = demonstration_data(spec, games_dir, tokenizer, config)
    trained_rows_sha256 = rows_sha256(dataset)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    trainer = AgentSFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                              peft_config=_lora_config(spec, model.config.num_hidden_layers))
    trainer.train()
    if spec.relabel_episodes_per_task:
        print(f"taspo_trl: DAgger round: {spec.relabel_episodes_per_task} sampled episodes per game, relabelled by the "
              "expert", file=sys.stderr, flush=True)
        corrections = relabelled_sft_dataset(
            trainer.model, tokenizer, rows, config, episodes_per_task=spec.relabel_episodes_per_task,
            max_turns=spec.relabel_max_turns, max_new_tokens=spec.relabel_max_new_tokens, seed=spec.seed,
        )
        second = AgentSFTConfig(**settings, num_train_epochs=spec.relabel_epochs, learning_rate=spec.relabel_learning_rate)
        dataset = concatenate_datasets([dataset, corrections]).shuffle(seed=spec.seed)
        trainer = AgentSFTTrainer(model=trainer.model, args=second, train_dataset=dataset, processing_class=tokenizer)
        trainer.train()
    model = trainer.model
    if spec.delta_rank:
        heal = AgentSFTConfig(**{**settings, "frozen_layers": 0}, num_train_epochs=spec.heal_epochs,
                              learning_rate=spec.heal_learning_rate) if spec.heal_epochs else None
        model = _keep_to_rank(model, spec, heal, dataset, tokenizer)
    _save_trained(model, tokenizer, spec, out_dir, adapter_dir or out_dir.parent / "adapter")
    return TrainedWarmStart(len(dataset), trained_rows_sha256)


def _sft_settings(spec: WarmStart, sft_dir: Path, bf16: bool) -> dict[str, Any]:
    """The ``AgentSFTConfig`` settings of a warm start's SFT rounds (epochs and learning rate aside)."""
    import torch

    return dict(
        output_dir=str(sft_dir),
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
        demonstration_stall_rate=spec.stall_rate,
        demonstration_foreign_pi_share=spec.foreign_pi_share,
        demonstration_pi_corrections=spec.pi_corrections,
        demonstration_thoughtless_share=spec.thoughtless_share,
        frozen_layers=spec.frozen_layers,
        use_cpu=not torch.cuda.is_available(),
        bf16=bf16,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
    )


def demonstration_data(spec: WarmStart, games_dir: Path, tokenizer: Any, config: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The SFT rows of warm start ``spec`` (the expert's demonstrations on its generated games, plus its guided games'
    rows) and the task rows of its games; ``config`` is its ``AgentSFTConfig``. Everything here is decided by the
    settings and the code of ``_DATA_MODULES``, none of it by a model."""
    from datasets import concatenate_datasets

    from .envs.alfworld import generate_games, task_spec_rows
    from .trainers.sft import demonstration_sft_dataset, guided_sft_dataset

    task_types = list(spec.task_types) if spec.task_types else None
    files = generate_games(games_dir, spec.games_per_type, spec.games_seed, "train", task_types=task_types)
    rows = task_spec_rows(files)
    dataset = demonstration_sft_dataset(rows, tokenizer, config)
    if spec.pi_games_per_type:
        guided_games = generate_games(games_dir / "guided", spec.pi_games_per_type, spec.games_seed + 1, "train",
                                      task_types=task_types)
        guided = guided_sft_dataset(task_spec_rows(guided_games), tokenizer, config)
        dataset = concatenate_datasets([dataset, guided]).shuffle(seed=spec.seed)
    return dataset, rows



def data_sha256(spec: WarmStart) -> str:
    """SHA-256 of the SFT rows a build of ``spec`` trains on first (``demonstration_data``, in order): what its
    weights depend on beyond the settings, when it has no DAgger round (whose rows come from the trained policy).
    Plays every demonstration on the real engine: minutes for the embedded warm start, not the build's hours."""
    import tempfile

    from transformers import AutoTokenizer

    from .models import prepare_tokenizer
    from .trainers.sft import AgentSFTConfig

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(resolve_policy_path(spec.base_model)))
    with tempfile.TemporaryDirectory(prefix="taspo-warm-start-data-") as work:
        config = AgentSFTConfig(**_sft_settings(spec, Path(work) / "sft", bf16=False),
                                num_train_epochs=spec.num_train_epochs, learning_rate=spec.learning_rate)
        dataset, _ = demonstration_data(spec, Path(work) / "games", tokenizer, config)
        return rows_sha256(dataset)


def rows_sha256(dataset: Iterable[Mapping[str, Any]]) -> str:
    """SHA-256 of SFT rows in order, each as sorted-key JSON on its own line."""
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def revalidate_shipped(name: str, shipped: Path | None = None) -> str:
    """Carry the shipped adapter of warm start ``name`` over a change to the code of ``_DATA_MODULES`` that leaves
    its training data as they were: when the shipped record's settings and build version are today's and the rows
    a build would train on hash to its ``data_sha256``, its fingerprint takes today's code hash (same data, same
    weights). Returns what it did, in a sentence; raises ``ValueError`` when the shipped adapter must be rebuilt."""
    spec = WARM_STARTS[name.strip().lower()]
    shipped = shipped or shipped_warm_start_dir(name)
    path = shipped / _FINGERPRINT_FILE
    record = json.loads(path.read_text())
    wanted = fingerprint(spec)
    if record["fingerprint"] == wanted:
        return f"{name}: the shipped fingerprint is current; nothing to do"
    rebuild = "rebuild it with python benchmarks/build_warm_start.py"
    if {k: v for k, v in record["fingerprint"].items() if k != "code_sha256"} != {
            k: v for k, v in wanted.items() if k != "code_sha256"}:
        raise ValueError(f"{name}: its settings or build version changed; {rebuild}")
    if spec.relabel_episodes_per_task:
        raise ValueError(f"{name}: a DAgger round trains on the policy's own episodes, which no data hash covers; {rebuild}")
    if "data_sha256" not in record:
        raise ValueError(f"{name}: the shipped record has no data_sha256 to compare with; {rebuild}")
    now = data_sha256(spec)
    if now != record["data_sha256"]:
        raise ValueError(f"{name}: the code change changes its training data (data_sha256 {now[:12]}, shipped "
                         f"{record['data_sha256'][:12]}); {rebuild}")
    path.write_text(json.dumps({**record, "fingerprint": wanted}, indent=2) + "\n")
    return f"{name}: same training data (data_sha256 {now[:12]}); the shipped fingerprint takes today's code hash"

def _keep_to_rank(model: Any, spec: WarmStart, heal: Any | None, dataset: Any, tokenizer: Any) -> Any:
    """The full fine-tune ``model``'s update truncated to ``spec.delta_rank`` as a PEFT adapter on the base model,
    then trained further as that adapter on ``dataset`` with the SFT settings ``heal`` (``None``: not at all)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .trainers.sft import AgentSFTTrainer

    base = AutoModelForCausalLM.from_pretrained(resolve_policy_path(spec.base_model), dtype=torch.float32)
    model = low_rank_update_adapter(base, model, spec.delta_rank)
    if heal is None:
        return model
    print(f"taspo_trl: update kept to rank {spec.delta_rank}; {spec.heal_epochs:g} more epochs train it as an adapter",
          file=sys.stderr, flush=True)
    trainer = AgentSFTTrainer(model=model, args=heal, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return trainer.model


def _lora_config(spec: WarmStart, num_layers: int) -> Any:
    """PEFT's LoRA settings of a LoRA warm start (every linear layer of the decoder layers above
    ``spec.frozen_layers``, no dropout); ``None`` for full fine-tuning."""
    if not spec.lora_rank:
        return None
    from peft import LoraConfig

    if spec.frozen_layers >= num_layers:
        raise ValueError(f"frozen_layers={spec.frozen_layers} leaves none of the model's {num_layers} layers to adapt.")
    if not spec.frozen_layers:
        return LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=0.0, target_modules="all-linear",
                          task_type="CAUSAL_LM")
    # PEFT takes a layer range only with the modules named; these are every linear layer of a Llama-style block.
    return LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=0.0, target_modules=list(_BLOCK_LINEARS),
                      layers_to_transform=list(range(spec.frozen_layers, num_layers)), task_type="CAUSAL_LM")


def truncated_update(update: Any, rank: int) -> tuple[Any, Any]:
    """``(B, A)`` whose product ``B @ A`` is the best approximation of rank ``rank`` of the matrix ``update`` (its
    truncated SVD, Eckart-Young), each singular value split evenly between the two factors. Each component's sign
    is fixed (the largest entry of its column of ``B`` is positive), so that a rebuild on another machine gives
    the same factors rather than a sign-flipped pair with the same product. Both factors have ``rank`` columns
    and rows (zeros past the matrix's own rank)."""
    import torch

    u, s, vh = torch.linalg.svd(update.double(), full_matrices=False)
    u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    signs = torch.sign(u.gather(0, u.abs().argmax(dim=0, keepdim=True)))
    root = s.sqrt()
    b, a = update.new_zeros(update.shape[0], rank), update.new_zeros(rank, update.shape[1])
    kept = len(s)  # a matrix narrower than ``rank`` is kept whole: its factors end in zeros
    b[:, :kept], a[:kept] = u * signs * root, vh * signs.T * root[:, None]
    return b, a


def low_rank_update_adapter(base: Any, tuned: Any, rank: int) -> Any:
    """``base`` wrapped as a PEFT model whose LoRA adapter holds, for every linear layer that ``tuned`` changed, the
    rank-``rank`` truncation of the update (``truncated_update``; ``lora_alpha = rank``, so the scale is 1), and
    whose saved modules hold the other changed parameters (the trained norms) whole. ``base`` and ``tuned`` are
    the same architecture; merging the adapter gives ``tuned`` with each linear update truncated."""
    import torch
    from peft import LoraConfig, get_peft_model

    tuned_modules = dict(tuned.named_modules())
    linear_updates, whole, seen = {}, [], set()
    for name, module in base.named_modules():
        if not isinstance(getattr(module, "weight", None), torch.nn.Parameter) or id(module.weight) in seen:
            continue  # a tied LM head is its embedding: saved once, with the embedding
        seen.add(id(module.weight))
        update = tuned_modules[name].weight.detach() - module.weight.detach()
        if not update.any():
            continue
        if isinstance(module, torch.nn.Linear) and module.bias is None:
            linear_updates[name] = update
        else:
            whole.append(name)
    if not linear_updates:
        raise ValueError("the tuned model changes no linear layer of the base model: there is no update to keep")
    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=sorted(linear_updates),
                        modules_to_save=sorted(whole) or None, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, update in linear_updates.items():
            layer = model.base_model.model.get_submodule(name)
            b, a = truncated_update(update, rank)
            layer.lora_B["default"].weight.copy_(b)
            layer.lora_A["default"].weight.copy_(a)
        for name in whole:
            saved = model.base_model.model.get_submodule(name).modules_to_save["default"]
            saved.weight.copy_(tuned_modules[name].weight)
    return model


def _save_trained(model: Any, tokenizer: Any, spec: WarmStart, out_dir: Path, adapter_dir: Path) -> None:
    """Save the trained policy to ``out_dir``; one with an adapter (LoRA, or a truncated update) also as that
    adapter to ``adapter_dir``, and ``out_dir`` then holds the merge of the saved adapter, as an install from the
    package does: the same weights."""
    if spec.adapter_rank:
        save_adapter(model, spec.base_model, adapter_dir)
        merge_adapter(spec.base_model, adapter_dir, out_dir)
        return
    tokenizer.padding_side = "left"
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
