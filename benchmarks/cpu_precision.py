"""float32 against bf16 autocast on this CPU: what the CPU recipes' ``bf16: true`` buys, and what it costs in
exactness.

Times, in one run, with the embedded SmolLM2-135M (float32 weights, as the recipes load it):
- **training**: forward+backward of a batch shaped like the warm start's SFT micro-batches (4 rows of 330
  tokens), with the embeddings and the lowest ``--frozen_layers`` layers fixed as the warm start has them;
- **sampling**: the rollouts' ``TransformersGenerator`` on 8 prompts of 270 tokens (a quickstart turn: 2
  tasks x 4 siblings, history window 1), each forced to 40 new tokens, in float32 and with
  ``autocast_dtype=torch.bfloat16`` (what the trainers pass when ``bf16`` is set).

It also reports how far bf16 moves the log-probabilities of the same tokens (largest absolute difference of
``log_softmax`` over a real chat prompt), and whether the CPU has bfloat16 instructions (AVX512-BF16 / AMX):
without them bf16 is emulated and slower, so an unset ``bf16`` follows them (``taspo_trl.precision``).

    python benchmarks/cpu_precision.py --repeats 3
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from taspo_trl.models import EMBEDDED_MODEL, prepare_tokenizer
from taspo_trl.warmstart import resolve_policy_path
from taspo_trl.precision import cpu_computes_bf16
from taspo_trl.rollout.generation import TransformersGenerator


def _train_seconds(model: torch.nn.Module, ids: torch.Tensor, bf16: bool, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        best = min(best, time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return best


def _sample_seconds(generator: TransformersGenerator, prompts: list[list[int]], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        generator(prompts)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument("--repeats", type=int, default=3, help="timings per setting; the fastest counts")
    parser.add_argument("--frozen_layers", type=int, default=15)
    args = parser.parse_args()

    torch.manual_seed(0)
    path = resolve_policy_path(args.model)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = model.config.vocab_size
    print(f"CPU has bfloat16 instructions (AVX512-BF16 or AMX): {cpu_computes_bf16()}; torch threads "
          f"{torch.get_num_threads()}", flush=True)

    model.train()
    for module in [model.get_input_embeddings(), *model.model.layers[: args.frozen_layers]]:
        module.requires_grad_(False)
    batch = torch.randint(100, vocab, (4, 330))
    train = {bf16: _train_seconds(model, batch, bf16, args.repeats) for bf16 in (False, True)}

    # The rollouts sample with the fully trained policy. Autocast keeps its bf16 copy of a weight for the whole
    # generate call only when the weight requires grad; frozen weights (a LoRA base) are cast again at every token.
    model.requires_grad_(True)
    model.eval()
    prompts = torch.randint(100, vocab, (8, 270)).tolist()
    forced = {"min_new_tokens": 40}
    plain = TransformersGenerator(model, tokenizer, max_new_tokens=40, generation_kwargs=forced)
    mixed = TransformersGenerator(model, tokenizer, max_new_tokens=40, generation_kwargs=forced,
                                  autocast_dtype=torch.bfloat16)
    sample = {False: _sample_seconds(plain, prompts, args.repeats), True: _sample_seconds(mixed, prompts, args.repeats)}

    chat = [{"role": "user", "content": "You are in the middle of a room. Your task is: put a cd in garbagecan."},
            {"role": "assistant", "content": "<think>Is a cd here? No.</think> <action>go to desk 1</action>"}]
    ids = torch.tensor([tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]])
    with torch.no_grad():
        exact = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            approx = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    taken = ids[0, 1:]
    gap = (exact[0, :-1].gather(-1, taken[:, None]) - approx[0, :-1].gather(-1, taken[:, None])).abs()

    print("| What | float32 | bf16 autocast | Speed-up |")
    print("|---|---|---|---|")
    print(f"| SFT-shaped forward+backward, 4 x 330 tokens, {args.frozen_layers} layers frozen | {train[False]:.2f} s | "
          f"{train[True]:.2f} s | x{train[False] / train[True]:.2f} |")
    print(f"| A rollout turn: 8 prompts x 270 tokens, 40 sampled tokens each | {sample[False]:.2f} s | "
          f"{sample[True]:.2f} s | x{sample[False] / sample[True]:.2f} |")
    print(f"log-prob of the same tokens, bf16 against float32 ({taken.numel()} tokens): largest difference "
          f"{gap.max().item():.3f} nats, mean {gap.mean().item():.4f}")


if __name__ == "__main__":
    main()
