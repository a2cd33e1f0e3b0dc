"""Where one CPU training step's time goes, and how the trainer's forward/backward compares with a bare torch
loop over the same rows.

One step of a quickstart recipe (default: GRPO on ALFWorld with the embedded SmolLM2-135M) runs with timing
wrappers around the trainer's phases, which change nothing they wrap:
- rollout: the batched agent loop (sampling and environment steps);
- log-prob passes: TRL's old-policy / reference log-probs of the rows (only when the loss needs them);
- privileged passes: the rescoring passes of TASPO / AlignOPSD / the teacher passes of the baselines;
- forward and backward: TRL's loss on each micro-batch, and its backward;
- other: rewards, credit, row building, the optimizer step, logging.
Then the same micro-batches (the tensors the loss saw) go through a bare torch loop on the same model:
forward with ``logits_to_keep``, log-softmax of the completion tokens, an advantage-weighted sum, backward.
Tokens are attended (unpadded) tokens; both loops see the same ones.

With the verified reward, a step in which every group fails trains no row at all (``--reward verified`` shows
such a step when it happens). By default a dense reward, the length of each trajectory's last response, is added
so that siblings differ and every row trains: the most work, and the most memory, a step can take.

    python benchmarks/step_profile.py
    python benchmarks/step_profile.py --config recipes/quickstart/alfworld_taspo_cpu.yaml --reward verified
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

import torch
from transformers import TrainerCallback

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.cli import build_trainer
from taspo_trl.trainers.grpo import environment_reward

from decode_pace import matmul_throughput, read_bandwidth  # this folder's

Batch = dict[str, Any]


def last_response_length(completions: list[str], **kwargs: Any) -> list[float]:
    """A dense reward that differs between siblings: characters of the last response, in hundreds."""
    return [len(c) / 100 for c in completions]


class PhaseTimer:
    """Wall seconds spent inside wrapped callables, per phase; a call nested in another timed call counts once
    (for the outer one)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._inside = False

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original: Callable = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return original(*args, **kwargs)
            self._inside = True
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - started
                self._inside = False

        setattr(owner, name, timed)


class StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.started = 0.0
        self.step_seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_seconds.append(time.perf_counter() - self.started)


def attended_tokens(batch: Batch) -> int:
    return int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())


def padded_tokens(batch: Batch) -> int:
    return batch["prompt_ids"].numel() + batch["completion_ids"].numel()


def bare_forward_backward(model: Any, micro_batches: list[Batch], bf16: bool) -> float:
    """Seconds for a plain forward + backward over ``micro_batches``: the policy-gradient surrogate on the
    completion tokens, without checkpointing, metrics or TRL's fused log-prob head; under bf16 autocast when the
    trainer ran under it."""
    checkpointing = model.is_activation_checkpointing
    if checkpointing:
        model.activation_checkpointing_disable()
    model.train()
    started = time.perf_counter()
    for batch in micro_batches:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        width = batch["completion_ids"].size(1)
        with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits[:, :-1]
        logps = logits.float().log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
        weight = batch["completion_mask"] * batch["tool_mask"]
        loss = -(logps * batch["advantages"] * weight).sum() / weight.sum().clamp(min=1.0)
        loss.backward()
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.activation_checkpointing_enable()
    return seconds


def profile(config: str, reward: str, overrides: list[str]) -> dict[str, Any]:
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        argv = ["--config", config, "--max_steps", "1", "--output_dir", out, "--logging_steps", "1", *overrides]
        rewards = [environment_reward] if reward == "verified" else [environment_reward, last_response_length]
        trainer = build_trainer(argv, callbacks=[clock], reward_funcs=rewards)
        timer = PhaseTimer()
        seen: list[Batch] = []
        timer.wrap(grpo_module, "run_agent_loop", "rollout")
        timer.wrap(trainer, "_batch_from_rows", "log-prob passes")
        for name in ("_snapshot_logprobs", "_teacher_logprobs"):
            if hasattr(trainer, name):
                timer.wrap(trainer, name, "privileged passes")
        compute_loss = trainer.compute_loss

        def recorded_loss(model: Any, inputs: Batch, *args: Any, **kwargs: Any) -> torch.Tensor:
            seen.append({k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
            return compute_loss(model, inputs, *args, **kwargs)

        trainer.compute_loss = recorded_loss
        timer.wrap(trainer, "compute_loss", "forward")
        timer.wrap(trainer.accelerator, "backward", "backward")
        try:
            trainer.train()
        finally:
            trainer.close()
        bare_seconds = bare_forward_backward(trainer.model, seen, trainer.args.bf16)
    logs = trainer.state.log_history[0]
    return {
        "step": clock.step_seconds[0],
        "phases": dict(timer.seconds),
        "bare": bare_seconds,
        "micro_batches": [(b["prompt_ids"].size(0), attended_tokens(b), padded_tokens(b)) for b in seen],
        "skipped_fraction": logs.get("rows/skipped_fraction"),
        "rows": logs.get("rows/count"),
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="recipes/quickstart/alfworld_grpo_cpu.yaml")
    parser.add_argument("--reward", choices=["dense", "verified"], default="dense")
    args, overrides = parser.parse_known_args()  # anything else overrides the recipe, e.g. --gradient_checkpointing true

    # The cores' pace drifts on shared machines: the same probe before and after says how far, during this run.
    probes = [_machine_probe()]
    result = profile(args.config, args.reward, overrides)
    probes.append(_machine_probe())
    phases = result["phases"]
    order = ["rollout", "log-prob passes", "privileged passes", "forward", "backward"]
    other = result["step"] - sum(phases.get(p, 0.0) for p in order)
    tokens = sum(t for _, t, _ in result["micro_batches"])
    padded = sum(p for _, _, p in result["micro_batches"])
    trainer_seconds = phases.get("forward", 0.0) + phases.get("backward", 0.0)

    print(f"\n{args.config} ({args.reward} reward), gradient_checkpointing={result['gradient_checkpointing']}, "
          f"{result['rows']:.0f} rows, skipped fraction {result['skipped_fraction']}")
    print(f"micro-batches (rows, attended tokens, padded tokens): {result['micro_batches']}")
    print("\n| phase | seconds | share of step |\n| --- | ---: | ---: |")
    for phase in order:
        seconds = phases.get(phase, 0.0)
        print(f"| {phase} | {seconds:.1f} | {seconds / result['step']:.0%} |")
    print(f"| other (rewards, credit, optimizer, logging) | {other:.1f} | {other / result['step']:.0%} |")
    print(f"| **step** | **{result['step']:.1f}** | 100% |")
    print("\n| forward + backward over the same micro-batches | seconds | tokens/s |\n| --- | ---: | ---: |")
    print(f"| trainer (TRL loss + backward) | {trainer_seconds:.1f} | {tokens / trainer_seconds:.0f} |")
    print(f"| bare torch loop | {result['bare']:.1f} | {tokens / result['bare']:.0f} |")
    print(f"\n{tokens} attended tokens in {padded} padded ({1 - tokens / padded:.0%} padding); "
          f"trainer / bare tokens/s = {result['bare'] / trainer_seconds:.2f} (target >= {1 / 1.3:.2f})")
    print("machine pace before / after the step: " + " / ".join(
        f"bf16 matmul {tflops:.2f} TFLOP/s, read {bandwidth:.1f} GB/s" for tflops, bandwidth in probes))


def _machine_probe() -> tuple[float, float]:
    """(TFLOP/s of a prefill-shaped bf16 matmul, GB/s of a 1 GiB read), as ``decode_pace.py`` measures them."""
    return matmul_throughput(2400, 576, 1536, torch.bfloat16), read_bandwidth(1.0)


if __name__ == "__main__":
    main()
