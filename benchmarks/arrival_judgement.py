"""Does a policy see whether the task's object is where it stands? A few-minute check of the one ALFWorld decision
that the warm start's episodes show it gets wrong.

    python benchmarks/arrival_judgement.py                                   # the embedded model and its warm start
    python benchmarks/arrival_judgement.py --models PATH [PATH ...] --out judgement.json

The expert plays fresh episodes (2 per game, expert seed 123, no injected mistakes) of the 12 generated
``eval_unseen`` games (2 per family) and of the quickstart's 6 train games, replayed through the agent loop
in the quickstart's prompts (turn layout, history window 1). Its arrival turns are kept: those whose thought
asks "Is a <kind> here?" and answers "Yes" (the object is in view, take it) or "No" (it is not, go on). For each,
the policy is given the prompt and the thought up to that question, and scored on the answer: whichever of the
two words it gives the higher log-probability is its decision, and it is right when that is the expert's. The
AUC is that of the margin log p(Yes) - log p(No) between the two kinds of arrival (ties count half): how well
the policy separates them at any threshold, not only at its own.

A policy that always answers "Yes" scores the share of arrivals with the object in view (0.56 on these
``eval_unseen`` games, 0.54 on the quickstart's), one that always answers "No" the rest. This needs
no sampling and no environment steps for the policy, so it runs in a few minutes, against the twelve of
``warm_start_eval.py``; it measures one decision, not whether episodes are won.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.models import load_model_and_tokenizer, prepare_tokenizer
from taspo_trl.trainers.sft import AgentSFTConfig, demonstration_sft_dataset
from taspo_trl.warmstart import resolve_policy_path

DECISIONS = ("Yes", "No")


def arrival_rows(rows: list[dict[str, Any]], tokenizer: Any, workdir: Path) -> list[tuple[list[dict], str, str]]:
    """(prompt messages, the thought's question, the expert's answer) for every arrival turn of 2 expert episodes
    per game."""
    config = AgentSFTConfig(output_dir=str(workdir / "unused"), environment="alfworld", layout="turn",
                            history_window=1, demonstrations_per_task=2, demonstration_seed=123, use_cpu=True,
                            bf16=False, report_to="none")
    found = []
    for row in demonstration_sft_dataset(rows, tokenizer, config):
        thought = row["completion"][0]["content"].removeprefix("<think>")
        if match := re.match(r"(Is an? .+? here\?) (Yes|No)\b", thought):
            found.append((row["prompt"], match[1], match[2]))
    return found


@torch.no_grad()
def decision_logprobs(model: Any, tokenizer: Any, prompt: list[dict], question: str) -> dict[str, float]:
    """Log-probability of each answer word (after a space), given the prompt and the thought up to ``question``."""
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) + "<think>" + question
    context = tokenizer(text, add_special_tokens=False)["input_ids"]
    context_logits = model(torch.tensor([context])).logits[0]
    scores = {}
    for word in DECISIONS:
        ids = tokenizer(text + " " + word, add_special_tokens=False)["input_ids"]
        shared = next((i for i, (a, b) in enumerate(zip(context, ids)) if a != b), len(context))
        # The context's own pass serves every word that adds one token after it; any other word needs its own.
        one_token = shared == len(context) and len(ids) == len(context) + 1
        logits = context_logits if one_token else model(torch.tensor([ids])).logits[0]
        logprobs = logits[shared - 1 :].log_softmax(-1)
        scores[word] = sum(logprobs[i - shared, ids[i]].item() for i in range(shared, len(ids)))
    return scores


def separation_auc(positives: list[float], negatives: list[float]) -> float:
    """The chance that a random positive scores above a random negative, ties counting half."""
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def judge(model: Any, tokenizer: Any, arrivals: list[tuple[list[dict], str, str]]) -> dict[str, Any]:
    margins = {word: [] for word in DECISIONS}
    for prompt, question, wanted in arrivals:
        scores = decision_logprobs(model, tokenizer, prompt, question)
        margins[wanted].append(scores["Yes"] - scores["No"])
    yes_right = sum(m > 0 for m in margins["Yes"])
    no_right = sum(m <= 0 for m in margins["No"])
    return {
        "accuracy": (yes_right + no_right) / max(len(arrivals), 1),
        "yes_right": f"{yes_right}/{len(margins['Yes'])}",
        "no_right": f"{no_right}/{len(margins['No'])}",
        "auc": separation_auc(margins["Yes"], margins["No"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+",
                        default=["embedded:smollm2-135m-instruct", "embedded:smollm2-135m-alfworld"])
    parser.add_argument("--out", default="benchmarks/results/arrival_judgement.json")
    args = parser.parse_args()
    paths = [resolve_policy_path(m) for m in args.models]  # builds a named warm start before anything is timed
    root = Path(tempfile.mkdtemp(prefix="arrival_judgement_"))
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(paths[0]))  # the arrival rows need only its chat template
    splits = {
        "eval_unseen": arrival_rows(task_spec_rows(generate_games(root / "eval_unseen", 2, 0, "eval_unseen")),
                                    tokenizer, root),
        "quickstart": arrival_rows(task_spec_rows(generate_games(root / "quickstart", 1, 0, "train")), tokenizer, root),
    }
    for split, arrivals in splits.items():
        print(f"{split}: {len(arrivals)} arrival turns, {sum(d == 'Yes' for *_, d in arrivals)} with the object in view",
              flush=True)
    results = []
    print("\n| Model | eval_unseen | Yes right | No right | AUC | quickstart games | Yes right | No right | AUC |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, path in zip(args.models, paths, strict=True):
        began = time.perf_counter()
        model, _ = load_model_and_tokenizer(path)
        model.eval()
        scores = {split: judge(model, tokenizer, arrivals) for split, arrivals in splits.items()}
        results.append({"model": name, **scores, "seconds": round(time.perf_counter() - began, 1)})
        cells = [f"{s['accuracy']:.2f} | {s['yes_right']} | {s['no_right']} | {s['auc']:.2f}" for s in scores.values()]
        print(f"| {name} | {' | '.join(cells)} |", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
