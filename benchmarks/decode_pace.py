"""The CPU sampler's pace against the hardware's: decode time per token step beside the weight-read limit, and
prefill throughput beside the matmul throughput, measured in one run, for the sampler as it is and as it was.

A decode step of a small model at batch 8 reads every weight of its linear layers once and computes little, so its
floor is those bytes (in the compute dtype) over the memory's read bandwidth. A prefill is a large matmul, so its
ceiling is the matmul throughput of the cores. The run measures both on this machine (a read of a 1 GiB tensor, a
prefill-shaped matmul), then times ``TransformersGenerator`` on ``--batch`` random prompts of ``--prompt-tokens``
tokens (a third of the rows left-padded by a tenth, as turns of unequal length are): ``1`` and ``--new-tokens`` new
tokens, the difference over the extra steps being one decode step. ``before`` is the sampler before its speed-ups
(``generate`` with its own cache, autocast over the float32 weights); ``after`` is today's (its own decode loop over
an in-place KV cache and the compute-dtype copy, drawing with ``sample_rows``, decode steps through
``FusedDecodeStep`` where the model has the Llama layout); ``unfused`` is today's with every step through the model's
own forward, which must sample the same tokens. The three alternate, ``--reps`` times each, and the medians are
reported. Today's sampler draws other tokens for a seed than ``generate`` (another exact
draw from the same distribution); one more call with ``generate``'s draw checks that it then samples the same
tokens as before. Last, a profiled call says where today's decode step spends its operator time (``decode_op_shares``:
linear layers, attention, the rest).

    python benchmarks/decode_pace.py                     # bf16 autocast where the CPU computes bf16, else float32
    python benchmarks/decode_pace.py --bf16 false        # float32
    python benchmarks/decode_pace.py --lora-rank 16      # the model under LoRA adapters on every linear layer (PEFT)

With ``--lora-rank`` the adapters' B starts random rather than at zero (PEFT's default), so that they add numbers as
trained adapters do; the weight-read limit counts their weights with the base weights (a few per cent more).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import taspo_trl.rollout.decode_step as decode_step
import taspo_trl.rollout.generation as generation
from taspo_trl.models import EMBEDDED_MODEL
from taspo_trl.warmstart import resolve_policy_path
from taspo_trl.precision import Precision, choose_precision
from taspo_trl.provenance import provenance, source_commit

RESULTS = Path(__file__).parent / "results"


def read_bandwidth(gib: float = 1.0, reps: int = 5) -> float:
    """GB/s of a sum over a ``gib`` GiB float32 tensor (reads it once; the best of ``reps``)."""
    data = torch.ones(int(gib * 2**30 / 4))
    best = min(_seconds(data.sum) for _ in range(reps))
    return data.numel() * 4 / best / 1e9


def matmul_throughput(rows: int, inner: int, outer: int, dtype: torch.dtype, reps: int = 5) -> float:
    """TFLOP/s of a (rows x inner) @ (inner x outer) matmul in ``dtype`` (the best of ``reps``)."""
    a, b = torch.randn(rows, inner).to(dtype), torch.randn(inner, outer).to(dtype)
    best = min(_seconds(lambda: a @ b) for _ in range(reps))
    return 2 * rows * inner * outer / best / 1e12


def linear_weight_bytes(model: Any, dtype: torch.dtype) -> int:
    """Bytes a decode step reads: every linear layer's weights (the output layer's included) in ``dtype``."""
    element = torch.tensor([], dtype=dtype).element_size()
    return sum(m.weight.numel() * element for m in model.modules() if isinstance(m, torch.nn.Linear))


def _seconds(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


@contextmanager
def sampler_as_before(generator: generation.TransformersGenerator) -> Iterator[None]:
    """``generate``'s own (concatenating) cache and autocast over the float32 weights, as before the speed-ups."""
    kept_cache, kept_copy = generation.growing_cache, generator.compute_copy
    generation.growing_cache, generator.compute_copy = (lambda model, capacity: None), None
    try:
        yield
    finally:
        generation.growing_cache, generator.compute_copy = kept_cache, kept_copy


def prompts(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = torch.Generator().manual_seed(seed)
    rows = [torch.randint(100, vocab, (length,), generator=rng).tolist() for _ in range(batch)]
    return [row[length // 10 :] if k % 3 == 0 else row for k, row in enumerate(rows)]


def time_sampler(generator: Any, batch_prompts: list[list[int]], new_tokens: int,
                 as_before: bool = False) -> tuple[float, list[list[int]]]:
    """Seconds for one call that decodes ``new_tokens`` steps in every row (no row stops early), and its tokens."""
    generator.max_new_tokens = new_tokens
    if as_before:  # ``generate``, kept from stopping by a minimum length
        generator.generation_kwargs["min_new_tokens"] = new_tokens
    else:  # the sampler's own loop, kept from stopping by a stop token outside the vocabulary
        generator.generation_kwargs.pop("min_new_tokens", None)
    torch.manual_seed(0)
    started = time.perf_counter()
    out = generator(batch_prompts)
    return time.perf_counter() - started, [g.token_ids for g in out]


def measure(model: Any, tokenizer: Any, args: argparse.Namespace, precision: Precision) -> dict[str, Any]:
    bf16 = precision.bf16
    dtype = torch.bfloat16 if bf16 else torch.float32
    generator = generation.TransformersGenerator(model, tokenizer, temperature=1.0,
                                                 autocast_dtype=torch.bfloat16 if bf16 else None,
                                                 stop_token_ids=[model.config.vocab_size])
    batch_prompts = prompts(model.config.vocab_size, args.batch, args.prompt_tokens)
    prompt_tokens = sum(len(p) for p in batch_prompts)
    contexts = {"before": lambda: sampler_as_before(generator), "unfused": without_fused_step, "after": _nothing}
    runs: dict[str, dict[str, list[float]]] = {name: {"prefill": [], "step": []} for name in contexts}
    samples: dict[str, list[list[int]]] = {}
    for _ in range(args.reps + 1):  # the first round warms them up and is not kept
        for name, context in contexts.items():
            with context():
                one, _ = time_sampler(generator, batch_prompts, 1, as_before=name == "before")
                many, samples[name] = time_sampler(generator, batch_prompts, args.new_tokens, name == "before")
            runs[name]["prefill"].append(one)
            runs[name]["step"].append((many - one) / (args.new_tokens - 1))
    with drawing_as_generate():
        _, samples["after, generate's draw"] = time_sampler(generator, batch_prompts, args.new_tokens)
    shares = decode_op_shares(generator, batch_prompts, args.new_tokens)
    for name in runs:
        runs[name] = {key: runs[name][key][1:] for key in runs[name]}
    bandwidth = read_bandwidth(args.read_gib)
    weights = linear_weight_bytes(model, dtype)
    flops = matmul_throughput(prompt_tokens, model.config.hidden_size, model.config.intermediate_size, dtype)
    limit_ms = weights / (bandwidth * 1e9) * 1e3
    result: dict[str, Any] = {
        "precision": precision.name,
        "read_bandwidth_gb_s": round(bandwidth, 2),
        "linear_weight_mb": round(weights / 1e6, 1),
        "weight_read_limit_ms": round(limit_ms, 2),
        "matmul_tflop_s": round(flops, 3),
        "prefill_tokens": prompt_tokens,
        "same_samples_with_generates_draw": samples["before"] == samples["after, generate's draw"],
        "same_samples_with_and_without_the_fused_step": samples["unfused"] == samples["after"],
    }
    for name, run in runs.items():
        step_ms = statistics.median(run["step"]) * 1e3
        prefill = statistics.median(run["prefill"])
        result[name] = {
            "decode_ms_per_step": round(step_ms, 2),
            "times_the_limit": round(step_ms / limit_ms, 2),
            "prefill_tokens_per_s": round(prompt_tokens / prefill, 1),
            "prefill_tflop_s": round(2 * _parameters(model) * prompt_tokens / prefill / 1e12, 3),
            "decode_ms_all": [round(s * 1e3, 2) for s in run["step"]],
        }
    result["decode_op_shares"] = shares  # of today's sampler (after)
    result["decode_speedup"] = round(result["before"]["decode_ms_per_step"] / result["after"]["decode_ms_per_step"], 2)
    result["fused_step_speedup"] = round(
        result["unfused"]["decode_ms_per_step"] / result["after"]["decode_ms_per_step"], 2)
    return result


OP_KINDS = {"linear layers": ("linear", "aten::mm", "aten::addmm"), "attention": ("scaled_dot_product", "attention")}
"""How ``decode_op_shares`` sorts the operators by name: the first kind a name contains a fragment of; else "other"."""


def decode_op_shares(generator: Any, batch_prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Where a decode step of today's sampler spends its operator time: the profiler's self CPU time per operator in
    a call of ``new_tokens`` steps minus that in a call of 1 (the prefill), summed by ``OP_KINDS``, as shares of the
    total. Python between the operators is not in it (the step's wall time is)."""
    from torch.profiler import profile

    per_op = []
    for tokens in (1, new_tokens):
        with profile() as profiled:
            time_sampler(generator, batch_prompts, tokens)
        per_op.append({event.key: event.self_cpu_time_total for event in profiled.key_averages()})
    kinds = {kind: 0.0 for kind in (*OP_KINDS, "other")}
    for name, micros in per_op[1].items():
        kind = next((k for k, fragments in OP_KINDS.items() if any(f in name for f in fragments)), "other")
        kinds[kind] += max(micros - per_op[0].get(name, 0.0), 0.0)
    total = sum(kinds.values()) or 1.0
    return {kind: round(micros / total, 3) for kind, micros in kinds.items()}


@contextmanager
def drawing_as_generate() -> Iterator[None]:
    """The sampler's own loop drawing with ``torch.multinomial``, as ``generate`` draws (its own draw is an exact
    draw from the same distribution with other random numbers)."""
    kept = generation.sample_rows
    generation.sample_rows = lambda probs: torch.multinomial(probs, num_samples=1).squeeze(1)
    try:
        yield
    finally:
        generation.sample_rows = kept


@contextmanager
def without_fused_step() -> Iterator[None]:
    """The sampler's own loop through the model's own forward at every step (no ``FusedDecodeStep``)."""
    kept = decode_step.FusedDecodeStep.for_model
    decode_step.FusedDecodeStep.for_model = lambda model: None
    try:
        yield
    finally:
        decode_step.FusedDecodeStep.for_model = kept


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _parameters(model: Any) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--read-gib", type=float, default=1.0, help="size of the tensor the bandwidth read sums")
    parser.add_argument("--bf16", choices=("true", "false"), default=None,
                        help="bf16 autocast (default: where the CPU computes bf16)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA adapters of this rank on every linear layer (0: none)")
    parser.add_argument("--out", default=None,
                        help="default: benchmarks/results/decode_pace_<bf16|float32>[_lora<rank>].json")
    args = parser.parse_args(argv)
    commit = source_commit(__file__)
    precision = choose_precision(None if args.bf16 is None else args.bf16 == "true", use_cpu=True)
    path = resolve_policy_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if args.lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                                                 target_modules="all-linear", init_lora_weights=False))
    result = {"settings": {"model": args.model, "batch": args.batch, "prompt_tokens": args.prompt_tokens,
                           "new_tokens": args.new_tokens, "reps": args.reps, "threads": torch.get_num_threads(),
                           "lora_rank": args.lora_rank},
              **measure(model, tokenizer, args, precision),
              "provenance": provenance(argv, __file__, commit=commit)}
    print(f"{result['precision']}, {torch.get_num_threads()} threads, batch {args.batch}: read bandwidth "
          f"{result['read_bandwidth_gb_s']} GB/s, linear weights {result['linear_weight_mb']} MB -> weight-read limit "
          f"{result['weight_read_limit_ms']} ms a decode step; matmul {result['matmul_tflop_s']} TFLOP/s")
    for name in ("before", "unfused", "after"):
        run = result[name]
        print(f"{name:>7}: decode {run['decode_ms_per_step']} ms a step ({run['times_the_limit']}x the limit), "
              f"prefill {run['prefill_tokens_per_s']} tokens/s ({run['prefill_tflop_s']} TFLOP/s)")
    shares = result["decode_op_shares"]
    print("after: a decode step's operator time: " + ", ".join(f"{kind} {share:.0%}" for kind, share in shares.items()))
    print(f"decode speed-up x{result['decode_speedup']} (the fused step's share x{result['fused_step_speedup']}, the "
          f"same samples with and without it: {result['same_samples_with_and_without_the_fused_step']}); with "
          "generate's draw (torch.multinomial) the same samples for the seed: "
          f"{result['same_samples_with_generates_draw']}")
    lora = f"_lora{args.lora_rank}" if args.lora_rank else ""
    out = Path(args.out or RESULTS / f"decode_pace_{'bf16' if precision.bf16 else 'float32'}{lora}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
