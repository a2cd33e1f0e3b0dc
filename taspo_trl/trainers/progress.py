"""One readable progress line per logged step: reward, success per task family, rollout time."""

from __future__ import annotations

from transformers import TrainerCallback


class ProgressPrinter(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero or "reward" not in logs:
            return
        families = " ".join(
            f"{k.split('/', 1)[1]}={v:.2f}" for k, v in sorted(logs.items()) if k.startswith("success/") and k != "success/all"
        )
        print(
            f"[step {state.global_step}/{state.max_steps}] reward={logs['reward']:.3f} "
            f"success={logs.get('success/all', float('nan')):.2f} ({families}) "
            f"turns={logs.get('env/turns_mean', float('nan')):.1f} "
            f"invalid={logs.get('env/invalid_action_rate', float('nan')):.2f} "
            f"rollout={logs.get('env/rollout_seconds', float('nan')):.1f}s loss={logs.get('loss', float('nan')):.4f}",
            flush=True,
        )
