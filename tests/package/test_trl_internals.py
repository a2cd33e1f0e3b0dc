"""The TRL internals the trainers here rely on still exist, with the parameters and roles they are used with.

The trainers override ``GRPOTrainer`` hooks (``_generate_and_score_completions``, ``_prepare_inputs``,
``_get_per_token_logps_and_entropies``), call its private methods, read and write its private state and import
helpers from ``trl.trainer.utils`` and ``trl.models``. TRL may change any of these in a minor release: an override
whose hook TRL renamed would simply never run. Each check fails naming the TRL version and what changed; the
last one fails when the trainers start using a TRL internal that the tables below do not list.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trl

from tests.helpers.cpu_config import cpu_trainer_kwargs

ROOT = Path(__file__).resolve().parents[2]
TESTED = re.search(r"^\s*(trl[<>=~!].*?)\s*$", (ROOT / "setup.cfg").read_text(), re.MULTILINE).group(1)

# Callables and the parameters used here: the leading positional names (passed positionally, or the signature an
# override must keep) and the keywords passed by name. Every other parameter must have a default.
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # overridden in trainers/grpo.py; the override passes these positionally to super()
    "trl.GRPOTrainer._get_per_token_logps_and_entropies": (
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
         "compute_aux_loss"), ()),
    "trl.GRPOTrainer._prepare_inputs": (("self", "generation_batch"), ()),  # overridden in trainers/grpo.py
    "trl.GRPOTrainer._generate_and_score_completions": (("self", "inputs"), ()),  # replaced in trainers/grpo.py
    "trl.GRPOTrainer._calculate_rewards": (("self", "inputs", "prompts", "completions", "completion_ids_list"), ()),
    "trl.GRPOTrainer._generate_single_turn": (  # rollout/generation.py, the vLLM path
        ("self", "prompt_ids", "images", "multimodal_fields", "num_generations"), ()),
    "trl.trainer.utils.pad": (("tensors",), ("padding_value", "padding_side")),
    "trl.trainer.utils.use_adapter": (("model",), ("adapter_name",)),
    "trl.trainer.utils.add_fused_lm_head": (("model",), ("temperature", "cast_lm_head_to_fp32")),
    "trl.trainer.utils._use_triton": (("device",), ()),  # patched by trainers/sft.py
    "trl.models.utils.unwrap_model_for_generation": (
        ("model", "accelerator"), ("gather_deepspeed3_params", "gradient_checkpointing_kwargs")),
    "trl.models.prepare_deepspeed": (("model", "accelerator"), ()),
    "trl.GRPOTrainer._save_checkpoint": (("self", "model"), ("trial",)),  # the env error-rate guard saves first
    "trl.GRPOTrainer._get_train_sampler": (("self", "dataset"), ()),  # wrapped in trainers/grpo.py (sampling.py)
    # a resume at or past max_steps loads the checkpoint's weights and returns without training (trainers/grpo.py)
    "trl.GRPOTrainer._load_from_checkpoint": (("self", "resume_from_checkpoint"), ()),
}

# (class or function, method of it or of a base class, name it must reference): how TRL reaches an override, or
# what TRL does with state the trainers read or write.
ROLES: list[tuple[str, str, str, str]] = [
    ("trl.GRPOTrainer", "training_step", "_prepare_inputs", "the training step takes its micro-batch from _prepare_inputs"),
    ("trl.GRPOTrainer", "training_step", "_step", "the training step counts micro-batches in _step"),
    ("trl.GRPOTrainer", "_prepare_inputs", "_generate_and_score_completions", "_prepare_inputs generates through it"),
    ("trl.GRPOTrainer", "_prepare_inputs", "_buffered_inputs", "_prepare_inputs buffers the micro-batches there"),
    ("trl.GRPOTrainer", "_compute_loss", "_get_per_token_logps_and_entropies", "the loss takes its log-probs there"),
    ("trl.GRPOTrainer", "_compute_loss", "_entropy_bonus_enabled", "the loss adds the entropy bonus when it is set"),
    ("trl.GRPOTrainer", "__init__", "_tag_names", "the model is tagged with the trainer's _tag_names"),
    ("trl.SFTTrainer", "__init__", "_tag_names", "the model is tagged with the trainer's _tag_names"),
    ("trl.GRPOTrainer", "log", "_metrics", "logging averages and clears _metrics"),
    ("trl.GRPOTrainer", "log", "_logs", "logging writes the completions table from _logs"),
    ("trl.GRPOTrainer", "create_model_card", "_name", "the model card names the trainer from _name"),
    ("trl.GRPOTrainer", "create_model_card", "_paper", "the model card cites the method's _paper"),
    ("trl.trainer.utils", "add_fused_lm_head", "_use_triton", "the fused LM head asks _use_triton at run time"),
    ("trl.GRPOTrainer", "get_train_dataloader", "_get_train_sampler", "the train dataloader's sampler comes from it"),
    ("trl.trainer.utils.RepeatSampler", "__iter__", "randperm", "a pass shuffles with one randperm (sampling.py replays it)"),
    ("trl.trainer.utils.RepeatSampler", "__iter__", "generator", "that randperm draws from the sampler's generator"),
]

# Private state of a GRPOTrainer instance that the trainers read or write.
STATE = ("_step", "_buffered_inputs", "_metrics", "_logs", "_tokenizer", "_entropy_bonus_enabled")


def _fail(what: str) -> None:
    pytest.fail(
        f"TRL {trl.__version__}: {what}. The trainers here rely on it and were tested with {TESTED} (setup.cfg): "
        "install a TRL in that range, or port taspo_trl/trainers to the new TRL and widen the range.",
        pytrace=False,
    )


def _resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
            if found is None:
                _fail(f"{path} no longer exists")
        return found
    raise AssertionError(f"nothing of {path} is importable")


def _referenced_names(function: Callable) -> set[str]:
    """Attribute and global names a function's code (nested functions included) refers to."""
    names, stack = set(), [inspect.unwrap(function).__code__]
    while stack:
        code = stack.pop()
        names |= set(code.co_names)
        stack += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return names


@pytest.mark.parametrize("path", list(SIGNATURES))
def test_signature(path):
    leading, keywords = SIGNATURES[path]
    parameters = inspect.signature(_resolve(path)).parameters
    names = list(parameters)
    if tuple(names[: len(leading)]) != leading:
        _fail(f"{path} now takes ({', '.join(names)}); the trainers use ({', '.join(leading)}, ...)")
    accepts_any_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    missing = [k for k in keywords if k not in parameters and not accepts_any_keyword]
    if missing:
        _fail(f"{path} no longer accepts {', '.join(missing)}")
    required = [
        n for n, p in parameters.items()
        if n not in leading and n not in keywords and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        _fail(f"{path} now requires {', '.join(required)}, which the trainers do not pass")


@pytest.mark.parametrize("owner,method,name,role", ROLES, ids=[f"{o}.{m}->{n}" for o, m, n, _ in ROLES])
def test_role(owner, method, name, role):
    found = _resolve(owner)
    implementations = (
        [vars(cls)[method] for cls in found.__mro__ if method in vars(cls)] if inspect.isclass(found)
        else [getattr(found, method)]
    )
    if not any(name in _referenced_names(function) for function in implementations):
        _fail(f"{owner}.{method} no longer refers to {name} ({role})")


@pytest.fixture(scope="module")
def grpo_trainer(tmp_path_factory, tiny_model_dir):
    """A plain TRL GRPOTrainer on the tiny model: the private state the trainers here share with it."""
    from datasets import Dataset

    def length_reward(completions: list, **kwargs: Any) -> list[float]:
        return [float(len(c)) for c in completions]

    args = trl.GRPOConfig(**cpu_trainer_kwargs(tmp_path_factory.mktemp("grpo")))
    dataset = Dataset.from_list([{"prompt": "Say hi."}] * 4)
    return trl.GRPOTrainer(model=tiny_model_dir, reward_funcs=length_reward, args=args, train_dataset=dataset)


def test_private_state_of_a_new_grpo_trainer(grpo_trainer):
    missing = [name for name in STATE if not hasattr(grpo_trainer, name)]
    if missing:
        _fail(f"GRPOTrainer instances no longer have {', '.join(missing)}")
    checks = {
        "_step starts at 0": grpo_trainer._step == 0,
        "_buffered_inputs starts empty (None)": grpo_trainer._buffered_inputs is None,
        "_metrics holds a list per metric name for 'train' and 'eval'":
            set(grpo_trainer._metrics) == {"train", "eval"} and grpo_trainer._metrics["train"]["any/name"] == [],
        "_logs has the prompt, completion, rewards, advantages and extra columns":
            {"prompt", "completion", "rewards", "advantages", "extra"} <= set(grpo_trainer._logs),
        "_logs['rewards'] and _logs['extra'] accept any column name":
            len(grpo_trainer._logs["rewards"]["any"]) == 0 and len(grpo_trainer._logs["extra"]["any"]) == 0,
        "_tokenizer is the tokenizer (it has a pad_token_id)": isinstance(grpo_trainer._tokenizer.pad_token_id, int),
        "_entropy_bonus_enabled is a bool": isinstance(grpo_trainer._entropy_bonus_enabled, bool),
    }
    broken = [what for what, holds in checks.items() if not holds]
    if broken:
        _fail("no longer: " + "; ".join(broken))


def _private_names_used_by_the_trainers() -> tuple[set[str], set[str]]:
    """(private names the trainers read, write or define on themselves or a TRL module, and that the rollout
    code reads from the trainer it is given; the subset that this code itself defines). Private names on other
    objects (models, torch, the rollout code's own classes) are not TRL's."""
    used, defined = set(), set()
    in_trainers = re.compile(r"^(self|super\(\)|trl\w*)$")
    in_rollout = re.compile(r"^(self\.trainer|trainer)$")
    sources = [(p, in_trainers) for p in sorted((ROOT / "taspo_trl" / "trainers").glob("*.py"))]
    sources += [(p, in_rollout) for p in sorted((ROOT / "taspo_trl" / "rollout").glob("*.py"))]
    for path, owner in sources:
        trainer_code = owner is in_trainers
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and re.match(r"_[a-z]", node.attr):
                if owner.match(ast.unparse(node.value)):
                    used.add(node.attr)
                    if isinstance(node.ctx, ast.Store):
                        defined.add(node.attr)
            elif trainer_code and isinstance(node, ast.FunctionDef) and re.match(r"_[a-z]", node.name):
                used.add(node.name)
                defined.add(node.name)
            elif trainer_code and isinstance(node, ast.ClassDef):
                for statement in node.body:
                    targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
                    for target in targets:
                        if isinstance(target, ast.Name) and re.match(r"_[a-z]", target.id):
                            used.add(target.id)
                            defined.add(target.id)
    return used, defined


def test_the_tables_list_every_trl_internal_the_trainers_use(grpo_trainer):
    import trl.models.utils
    import trl.trainer.utils

    trl_names = set(dir(grpo_trainer)) | set(dir(trl.SFTTrainer)) | set(dir(trl.trainer.utils)) | set(dir(trl.models.utils))
    used, defined = _private_names_used_by_the_trainers()
    listed = {path.rsplit(".", 1)[1] for path in SIGNATURES} | {name for *_, name, _ in ROLES} | set(STATE)
    unlisted = sorted((used & trl_names) - listed)
    assert not unlisted, f"the trainers use TRL {trl.__version__} internals {unlisted}: add them to the tables above"
    unknown = sorted(used - defined - trl_names)
    if unknown:
        _fail(f"the trainers read {', '.join(unknown)}, which neither they nor TRL define (renamed or removed by TRL?)")
