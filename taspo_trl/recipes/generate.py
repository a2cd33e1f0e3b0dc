"""Writes every recipe under recipes/quickstart and recipes/paper from the tables below.

    python recipes/generate.py          # rewrite the recipes
    python recipes/generate.py --check  # exit 1 if a file differs from what this script writes (a test runs it)

Edit the tables here, not the YAML files, so the grid (benchmark x method x model) stays consistent.
Paper settings are Table C.2 of the TASPO paper; method settings are the papers' (see each config's docstring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from taspo_trl.credit.registry import CREDIT_METHODS
from taspo_trl.trainers import method_names
from taspo_trl.warmstart import FRESH_GAMES_SEED, WARM_STARTS

ROOT = Path(__file__).resolve().parent
# The ALFWorld quickstarts start from the warm-started embedded policy: the base model never writes a valid action.
ALFWORLD_WARM_START = "embedded:smollm2-135m-alfworld"

# Every registered method gets recipes; each recipe's header is the registry entry's title and summary.
METHODS = tuple(method_names())
CORE_METHODS = ("grpo", "taspo", "alignopsd")
SKILL_BANKS = {"alfworld": "alfworld", "webshop": "webshop", "search": "searchqa"}
# GiGPO's normalisation and anchor matching per benchmark, as verl-agent's GiGPO launchers set them
# (examples/gigpo_trainer/run_{alfworld,webshop,search}.sh: mode and enable_similarity / similarity_thresh).
GIGPO_LAUNCHERS = {
    "alfworld": ["gigpo_norm: mean_std  # verl-agent's ALFWorld launcher: mean_std_norm"],
    "webshop": ["gigpo_norm: mean  # verl-agent's WebShop launcher: mean_norm"],
    "search": [
        "gigpo_norm: mean_std  # verl-agent's Search launcher: mean_std_norm",
        "gigpo_similarity_threshold: 0.9  # and similarity-based anchor states",
    ],
}

# The paper runs its analyzer with reasoning off (TASPO Table C.3); quoted, since YAML reads a bare off as false.
ANALYZER_REASONING = 'analyzer_reasoning: "off"  # the request field: analyzer_reasoning_param (DeepSeek: thinking)'

METHOD_TITLES = {name: f"{CREDIT_METHODS[name].title} ({CREDIT_METHODS[name].summary})" for name in METHODS}


# AlignOPSD's six official profiles: the values examples/beyond_timestamps_trainer/run_<benchmark>_<size>.sh of
# mingju-c/Align-OPSD sets (beyond what PAPER_ENVS already holds). Shared by all six: eight rollouts, lr 1e-6,
# token-mean loss, 512 response tokens, 150 steps, profile temperature 0.1, JSD, quantile 0.8 clipped to
# [0.01, 0.10], spans of 2-8 turns, mixing 0.5 on the box [0, 4], aggregation temperature 0.1. `reward_scale`: what
# the launcher's environment pays for a win (verl-agent's ALFWorld and the official WebShop envs.py: 10; the
# Search-R1 environment: the exact match, 1).
ALIGNOPSD_PROFILES = {
    ("alfworld", "3b"): dict(threshold=0.65, top_k=2, alpha_max=0.8, mode="probability_mixture", credit=0.5,
                             scope="turn", action_filter=True, invalid=0.1, teacher=2048, sdar=True,
                             reward_scale=10.0),
    ("alfworld", "7b"): dict(threshold=0.8, top_k=3, alpha_max=0.8, mode="probability_mixture", credit=0.5,
                             scope="turn", action_filter=False, invalid=0.1, teacher=2048, sdar=False,
                             reward_scale=10.0),
    ("webshop", "3b"): dict(threshold=0.8, top_k=3, alpha_max=0.8, mode="probability_mixture", credit=0.2,
                            scope="turn", action_filter=True, invalid=0.1, teacher=2048, sdar=False, reward_scale=10.0),
    ("webshop", "7b"): dict(threshold=0.8, top_k=2, alpha_max=0.8, mode="probability_mixture", credit=0.5,
                            scope="turn", action_filter=False, invalid=0.1, teacher=2048, sdar=False,
                            reward_scale=10.0),
    # Search-3B leaves the teacher budget null: the rollout's 512 response tokens.
    ("search", "3b"): dict(threshold=0.7, top_k=3, alpha_max=0.2, mode="log_mean", credit=1.0,
                           scope="trajectory", action_filter=False, invalid=0.01, teacher=None, sdar=False,
                           reward_scale=1.0),
    ("search", "7b"): dict(threshold=0.7, top_k=3, alpha_max=0.8, mode="probability_mixture", credit=0.5,
                           scope="turn", action_filter=False, invalid=0.01, teacher=2048, sdar=False, reward_scale=1.0),
}


def alignopsd_block(env: str, model_key: str, cpu: bool) -> list[str]:
    """AlignOPSD's settings: the official profile of the benchmark and model size (7B for qwen2.5-7b, else 3B).
    The CPU quickstart keeps the 3B profile but gives the teacher the rollout's short response budget."""
    size = "7b" if model_key == "qwen2.5-7b" else "3b"
    p = ALIGNOPSD_PROFILES[(env, size)]
    where = f"run_{env}_{size}.sh" if model_key in ("qwen2.5-3b", "qwen2.5-7b") else f"run_{env}_3b.sh (the nearest size)"
    official = "null" if p["teacher"] is None else p["teacher"]
    if cpu and env == "webshop":
        # A 135M policy rarely buys the exact item: the graded score keeps groups moving on a CPU.
        outcome = "outcome_reward: env  # CPU: the graded purchase score (official: win, 10 on a win, 0 otherwise)"
    else:
        outcome = "outcome_reward: win  # 1 on a win, 0 otherwise, times reward_scale, as the official environments pay"
    if cpu:
        teacher = f"teacher_max_new_tokens: null  # CPU: the rollout's budget, max_completion_length (official: {official})"
    elif p["teacher"] is None:
        teacher = "teacher_max_new_tokens: null  # as the launcher: max_completion_length"
    else:
        teacher = f"teacher_max_new_tokens: {official}"
    lines = [
        f"# The official profile of mingju-c/Align-OPSD, examples/beyond_timestamps_trainer/{where}.",
        "turn_balanced_loss: false  # the official loss is the token mean",
        f"skill_bank: {SKILL_BANKS[env]}", "skill_top_k: 2",
        f"similarity_threshold: {p['threshold']}", f"source_top_k: {p['top_k']}", f"alpha_max: {p['alpha_max']}",
        f"aggregation_mode: {p['mode']}", "aggregation_temperature: 0.1",
        f"action_filter: {str(p['action_filter']).lower()}  # paper: on every benchmark (set true for the paper's reading)",
        "action_threshold: 0.8", teacher,
        "profile_temperature: 0.1", "profile_distance: jsd", "segmentation_quantile: 0.8",
        "segmentation_threshold_min: 0.01", "segmentation_threshold_max: 0.1", "span_min_turns: 2", "span_max_turns: 8",
        f"credit_temperature: {p['credit']}", "mixing_coefficient: 0.5", "density_upper_bound: 4.0",
        "weighting_mode: legacy", f"grpo_normalization_scope: {p['scope']}", "advantage_epsilon: 1.0e-6",
        f"invalid_action_coef: {p['invalid']}",
        f"reward_scale: {p['reward_scale']}  # the launcher's environment pays {p['reward_scale']:g} for a win",
        outcome, "span_threshold_scope: batch  # the threshold pools every group's distances, moving or not",
        "ablation: E",
    ]
    if env in ("alfworld", "webshop") and not cpu:
        lines.append("# The launcher validates with sampling at temperature 0.4: taspo-eval ... --temperature 0.4")
    if p["sdar"] and not cpu:
        lines += ["# The launcher adds the SDAR auxiliary loss, which the paper does not describe: sdar_aux false",
                  "# gives the paper's reading.",
                  "sdar_aux: true", "sdar_aux_coef: 0.01", "sdar_aux_gate_beta: 5.0"]
    elif p["sdar"]:
        lines += ["# The launcher adds the SDAR auxiliary loss (sdar_aux: true, coef 0.01, gate beta 5.0), which the",
                  "# paper does not describe. Off on CPU: it would score every trajectory under p_x, moving or not."]
    return lines


def method_block(method: str, env: str, cpu: bool, model_key: str = "qwen2.5-3b") -> list[str]:
    """Method-specific keys (besides `method:`); ``model_key`` picks AlignOPSD's official profile."""
    bank = SKILL_BANKS[env]
    if method == "grpo":
        return ["turn_balanced_loss: true"]
    if method == "taspo":
        # The rule-based analyzer reads ALFWorld, WebShop and Search-QA, so every benchmark runs the paper's
        # aligned PI offline; the paper's own analyzer is an LLM (analyzer: openai).
        return [
            "turn_balanced_loss: true",
            "analyzer: rule  # paper: analyzer: openai + analyzer_base_url / analyzer_model (DeepSeek or local vLLM)",
            ANALYZER_REASONING,
            "pi_source: aligned",
            "c_delta: 2.0", "tau: 0.5", "eps_w: 0.4", "pi_token_budget: 256", "allocation_unit: action",
        ]
    if method == "alignopsd":
        return alignopsd_block(env, model_key, cpu)
    lines = ["turn_balanced_loss: true", f"skill_bank: {bank}", "skill_top_k: 2"]
    if method in ("opid", "skill_sd"):
        written = "OPID's guidance and step skills" if method == "opid" else "Skill-SD's skills"
        lines += [f"analyzer: rule  # {written} come from the analyzer backend (openai for an LLM)", ANALYZER_REASONING]
    extra = {
        "opsd": ["distill_coef: 1.0", "teacher_policy: initial"],
        "grpo_opsd": ["distill_coef: 0.1", "teacher_policy: initial"],
        "sdar": ["distill_coef: 0.01", "sdar_beta: 5.0"],
        "skill_sd": [
            "distill_coef: 0.1", "skill_sd_is_clip: 2.0",
            "pi_source: success_skills  # skills the analyzer summarises from the group's other successes",
            "teacher_sync_steps: 10  # the teacher: a frozen copy of the policy, refreshed every 10 steps",
        ],
        "opd": [
            "distill_coef: 1.0",
            "teacher_model_name_or_path: "
            + ("embedded:smollm2-135m-instruct  # CPU smoke test: the policy itself; use a larger model on GPUs"
               if cpu else "Qwen/Qwen2.5-7B-Instruct  # Table 5: a larger frozen teacher, same tokenizer"),
        ],
        "rlsd": ["rlsd_lambda: 0.5", "rlsd_decay_steps: 50", "rlsd_clip: 0.2"],
        "opid": ["pi_source: aligned", "opid_episode_weight: 0.001", "opid_step_weight: 0.001", "opid_max_step_skills: 5"],
        "gigpo": ["gigpo_omega: 1.0", "gigpo_gamma: 0.95", *GIGPO_LAUNCHERS[env]],
        "stepopsd": ["stepopsd_temperature: 1.0", "stepopsd_bound: 0.5"],
    }
    return lines + extra.get(method, [])


def quickstart_env_block(env: str) -> list[str]:
    if env == "alfworld":
        return [
            "# Environment and tasks: one generated game per task family (6 tasks), generated on first use, from a",
            "# seed whose games the warm start never saw (it trained on games_seed 0).",
            "environment: alfworld", "games_dir: outputs/alfworld_games/quickstart", "games_per_type: 1",
            f"games_seed: {FRESH_GAMES_SEED}", "games_split: train",
            "max_turns: 12  # the expert needs 4-8 turns (Pick2 8-12) when it searches; a sampled policy more",
            "history_window: 1", "max_prompt_tokens: 2048",
        ]
    if env == "webshop":
        return [
            "# Environment and tasks: the embedded WebShop catalogue and goals (train split); the oracle needs 4-6 turns.",
            "environment: webshop", "task_source: embedded", "task_split: train", "max_tasks: 32",
            "max_turns: 6", "history_window: 1", "max_prompt_tokens: 2048",
        ]
    return [
        "# Environment and tasks: the embedded Search-QA set, bm25s over the shipped corpus (no server needed).",
        "environment: search", "task_source: embedded", "task_split: train", "retriever: embedded",
        "retrieval_topk: 3", "max_tasks: 32", "max_turns: 3", "history_window: 2", "max_prompt_tokens: 2048",
    ]


def quickstart(env: str, method: str) -> str:
    lines = [
        f"# {METHOD_TITLES[method]} on the embedded {env} with the embedded SmolLM2-135M-Instruct, sized for a "
        "2-core CPU.",
        f"#   taspo-train --config {env}_{method}_cpu",
        "# Any key can be overridden on the command line, e.g. --max_steps 10 --layout sequence.",
        "# Generated by recipes/generate.py: edit that script, not this file.",
        f"method: {method}",
        *(["# The embedded model after SFT on expert demonstrations (built on first use, ~10 min; see sft recipe).",
           f"model_name_or_path: {ALFWORLD_WARM_START}"] if env == "alfworld"
          else ["model_name_or_path: embedded:smollm2-135m-instruct"]),
        "",
        *quickstart_env_block(env),
        "",
        "# Rollouts: 2 tasks x 4 siblings per optimizer step; short episodes and responses. In the turn layout a",
        "# micro-batch holds the turns of per_device_train_batch_size trajectories, which bounds memory: one",
        "# trajectory's 12 ALFWorld turns took 14 GB at the peak of a step that trained every row; two need more",
        "# than a 24 GiB machine has.",
        "layout: turn", "num_generations: 4", "per_device_train_batch_size: 1", "gradient_accumulation_steps: 8",
        "max_completion_length: 48", "temperature: 1.0",
        "# Rows per no-grad scoring forward (the privileged and plain passes), sorted by length so that chunks",
        "# pad little: 1.3x faster than one row at a time on a 2-core CPU.",
        "rescore_batch_size: 8",
        "",
        "# Optimisation (Table C.2 uses lr 1e-6 over 150 updates; a few CPU steps use a larger one).",
        *(["# Two steps play 4 of the 6 tasks and keep the README's first command, warm start included, within",
           "# 20 minutes on a 2-core CPU; --max_steps 3 plays all six (a step with wins takes about 5 minutes).",
           "max_steps: 2"] if env == "alfworld" else ["max_steps: 3"]),
        "learning_rate: 1.0e-5", "beta: 0.0", "loss_type: dapo",
        "",
        "# CPU: float32 weights; bf16 unset, so it follows the hardware: bf16 autocast on a CPU with bfloat16",
        "# instructions (AVX512-BF16 or AMX: about 1.6x faster), float32 on one without (where bf16 is emulated",
        "# and tens of times slower); --bf16 true/false decides instead. No gradient checkpointing (TRL's",
        "# default): a 135M model's activations fit in memory, recomputing them costs time.",
        "use_cpu: true", "dtype: float32", "gradient_checkpointing: false", "logging_steps: 1",
        "report_to: none", 'save_strategy: "no"',
        f"output_dir: outputs/quickstart_{env}_{method}", "seed: 0",
        "",
        "# Method settings.",
        *method_block(method, env, cpu=True),
    ]
    return "\n".join(lines) + "\n"


def sft_quickstart(env: str) -> str:
    """The warm start on the environment's expert demonstrations; ALFWorld's equals the built-in warm start."""
    if env == "alfworld":
        spec = WARM_STARTS[ALFWORLD_WARM_START]
        tasks = [
            "# Tasks: generated train games, several expert episodes each (the quickstarts play other seeds).",
            "environment: alfworld", "games_dir: outputs/alfworld_games/sft", f"games_per_type: {spec.games_per_type}",
            f"games_seed: {spec.games_seed}", "games_split: train",
            f"demonstrations_per_task: {spec.demonstrations_per_task}",
            f"demonstration_pi_episodes: {spec.pi_episodes}  # of those, informed ones with TASPO's privileged context",
            f"demonstration_foreign_pi_share: {spec.foreign_pi_share}  # plain ones shown another task's context",
            f"demonstration_pi_corrections: {str(spec.pi_corrections).lower()}  # informed corrections of plain ones, "
            "with P_i",
            f"demonstration_mistake_rate: {spec.mistake_rate}",
            *([f"demonstration_wander_rate: {spec.wander_rate}"] if spec.wander_rate else []),
            *([f"demonstration_stall_rate: {spec.stall_rate}  # turns that stall (look, inventory), then the expert's way "
               "on"] if spec.stall_rate else []),
            *([f"demonstration_thoughtless_share: {spec.thoughtless_share}  # rows with P_i and an empty thought: the action "
               "chooses"] if spec.thoughtless_share else []),
        ]
        prompt = [f"layout: {spec.layout}", f"history_window: {spec.history_window}"]
        optimisation = [
            f"num_train_epochs: {spec.num_train_epochs}", f"learning_rate: {spec.learning_rate}",
            f"per_device_train_batch_size: {spec.per_device_train_batch_size}",
            f"gradient_accumulation_steps: {spec.gradient_accumulation_steps}", f"seed: {spec.seed}",
            *([f"frozen_layers: {spec.frozen_layers}  # embeddings and the lowest layers fixed: faster steps on a CPU"]
              if spec.frozen_layers else []),
            "train_sampling_strategy: group_by_length  # the rows with privileged context are longer: less padding",
        ]
        adapter = [
            "", "# A LoRA adapter on every linear layer above frozen_layers (the factors below stay at zero), as the",
            "# package ships it (in float16).",
            "use_peft: true", f"lora_r: {spec.lora_rank}", f"lora_alpha: {spec.lora_alpha}", "lora_dropout: 0.0",
            "lora_target_modules: all-linear",
        ] if spec.lora_rank else []
    else:
        block = quickstart_env_block(env)
        tasks = ["# Tasks: the expert (oracle) episodes of the embedded train split.", *block[1:-2]]
        prompt = ["layout: turn", block[-2]]
        optimisation = ["num_train_epochs: 2", "learning_rate: 1.0e-4", "per_device_train_batch_size: 4",
                        "gradient_accumulation_steps: 2", "seed: 0"]
        adapter = []
    lines = [
        f"# SFT warm start of the embedded SmolLM2-135M-Instruct on the {env} expert's demonstrations, rendered in",
        "# the quickstart recipes' prompts, with TRL's SFTTrainer (loss on the expert's responses only).",
        f"#   taspo-train --config {env}_sft_cpu",
        *([] if adapter else
          ["# LoRA instead of full fine-tuning: --use_peft true --lora_r 16 --lora_alpha 32 --lora_target_modules all-linear"]),
        "# Generated by recipes/generate.py: edit that script, not this file.",
        "method: sft",
        "model_name_or_path: embedded:smollm2-135m-instruct",
        "",
        *tasks,
        "",
        "# Prompts exactly as the RL recipes render them.",
        *prompt,
        "",
        "# Optimisation.",
        *optimisation,
        "lr_scheduler_type: cosine", "warmup_steps: 0.1", "completion_only_loss: true",
        *adapter,
        "",
        "# CPU: float32 weights; bf16 unset, so it follows the hardware (bf16 autocast on a CPU with bfloat16",
        "# instructions, float32 on one without; --bf16 true/false decides instead); no gradient checkpointing",
        "# (a 135M model fits without it; it costs a third more compute).",
        "use_cpu: true", "dtype: float32", "gradient_checkpointing: false", "logging_steps: 5",
        "report_to: none",
        'save_strategy: "no"', f"output_dir: outputs/quickstart_{env}_sft",
    ]
    return "\n".join(lines) + "\n"


# Table C.2 per benchmark: tasks per update, max turns, max prompt tokens, KL, warmup ratio.
PAPER_ENVS = {
    "alfworld": dict(tasks=16, turns=50, prompt=2048, kl=0.01, warmup=0.0),
    "webshop": dict(tasks=16, turns=15, prompt=4096, kl=0.01, warmup=0.0),
    "search": dict(tasks=128, turns=4, prompt=4096, kl=0.001, warmup=0.1),
}
MODELS = {
    "qwen2.5-3b": "Qwen/Qwen2.5-3B-Instruct",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
}


def paper_env_block(env: str) -> list[str]:
    if env == "alfworld":
        return [
            "# Official ALFWorld games ($ALFWORLD_DATA/json_2.1.1/train, 3,553 games) or, when the folder is empty,",
            "# 100 generated games per family. Evaluate with taspo-eval (eval_seen / eval_unseen).",
            "environment: alfworld", "games_dir: data/alfworld/json_2.1.1/train", "games_per_type: 100",
            "games_seed: 0", "games_split: train",
        ]
    if env == "webshop":
        return [
            "# Embedded catalogue; for the official site set webshop_url: http://127.0.0.1:3000 (envs/webshop/README.md).",
            "environment: webshop", "task_source: embedded", "task_split: train",
        ]
    return [
        "# Search-R1's NQ + HotpotQA training files and its e5 + wiki-18 retrieval server (envs/search/README.md).",
        "environment: search", "task_source: data/searchr1", "task_split: train", "search_datasets: [nq, hotpotqa]",
        "retriever: http://127.0.0.1:8000", "retrieval_topk: 3",
    ]


def paper(env: str, method: str, variant: str) -> str:
    setting = PAPER_ENVS[env]
    model_key = "qwen2.5-3b" if variant == "lora" else variant
    lora = variant == "lora"
    per_device = 16 if env == "search" else 2  # x 8 GPUs x 8 accumulation steps = tasks x 8 rollouts
    launch = "zero3" if variant == "qwen2.5-7b" and not lora else "multi_gpu"
    lines = [
        f"# {METHOD_TITLES[method]} on {env}, {MODELS[model_key]}{' with LoRA' if lora else ''}, at the paper's",
        "# settings (TASPO Table C.2). Sized for 8 GPUs:",
        f"#   accelerate launch --config_file \"$(taspo-recipes path {launch})\" -m taspo_trl.cli \\",
        f"#     --config paper/{env}/{method}_{variant} --seed 0   # seeds 0, 1, 2",
        "# vLLM server mode instead of colocate: run `trl vllm-serve --model MODEL` on its own GPU and add",
        "# --vllm_mode server. Fewer GPUs: keep per_device_train_batch_size x gradient_accumulation_steps x GPUs =",
        f"# {setting['tasks'] * 8} trajectories ({setting['tasks']} tasks x 8 rollouts).",
        "# Generated by recipes/generate.py: edit that script, not this file.",
        f"method: {method}",
        f"model_name_or_path: {MODELS[model_key]}",
        *(["use_peft: true", "lora_r: 64", "lora_alpha: 128", "lora_dropout: 0.05", "lora_target_modules: all-linear"]
          if lora else []),
        "",
        *paper_env_block(env),
        "",
        "# Rollouts (Table C.2).",
        f"max_turns: {setting['turns']}", f"max_prompt_tokens: {setting['prompt']}", "layout: turn", "history_window: 3",
        "num_generations: 8", f"per_device_train_batch_size: {per_device}", "gradient_accumulation_steps: 8",
        "max_completion_length: 512", "temperature: 1.0", "top_p: 1.0",
        "use_vllm: true", "vllm_mode: colocate", "vllm_gpu_memory_utilization: 0.3",
        "",
        "# Policy optimisation (Table C.2). `delta` is TRL's upper clip for negative advantages, i.e. the dual-clip",
        "# coefficient; `entropy_coef` is TRL's entropy bonus (the mean per-token entropy).",
        "max_steps: 150", f"learning_rate: {'1.0e-5  # LoRA: 10x the full fine-tuning rate' if lora else '1.0e-6'}",
        "adam_beta1: 0.9", "adam_beta2: 0.999", "weight_decay: 0.01", "max_grad_norm: 1.0",
        f"warmup_steps: {setting['warmup']}", "epsilon: 0.2", "delta: 3.0", "num_iterations: 1",
        f"beta: {setting['kl']}", "entropy_coef: 0.001", "loss_type: dapo",
        "",
        "# The weights load in bfloat16 (as TRL's scripts with --dtype bfloat16) and compute runs in bf16 autocast.",
        "dtype: bfloat16", "bf16: true", "gradient_checkpointing: true", "logging_steps: 1", "report_to: tensorboard",
        "log_completions: true", "save_steps: 50", f"output_dir: outputs/paper/{env}/{method}_{variant}", "seed: 0",
        "",
        "# Method settings.",
        *method_block(method, env, cpu=False, model_key=model_key),
    ]
    return "\n".join(lines) + "\n"


def recipes() -> dict[Path, str]:
    out: dict[Path, str] = {}
    for method in METHODS:
        out[ROOT / "quickstart" / f"alfworld_{method}_cpu.yaml"] = quickstart("alfworld", method)
    for env in SKILL_BANKS:
        out[ROOT / "quickstart" / f"{env}_sft_cpu.yaml"] = sft_quickstart(env)
    for env in ("webshop", "search"):
        for method in CORE_METHODS:
            out[ROOT / "quickstart" / f"{env}_{method}_cpu.yaml"] = quickstart(env, method)
    for env in PAPER_ENVS:
        for method in METHODS:
            out[ROOT / "paper" / env / f"{method}_qwen2.5-3b.yaml"] = paper(env, method, "qwen2.5-3b")
        for method in CORE_METHODS:
            for variant in ("qwen2.5-7b", "qwen3-1.7b", "lora"):
                out[ROOT / "paper" / env / f"{method}_{variant}.yaml"] = paper(env, method, variant)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if a recipe file is missing or out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in recipes().items():
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python recipes/generate.py):", *map(str, stale), sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
