"""One readable progress line per logged step: reward, success per task family, rollout time, and the credit
method's own evidence that it redistributed credit (PI coverage, weight spread, decision matches)."""

from __future__ import annotations

from transformers import TrainerCallback

# Shown when the method logs them: TASPO's PI coverage and weight spread, AlignOPSD's match rate, and the range of
# the per-turn weights that every redistribution method logs.
_METHOD_METRICS = ("pi/coverage", "taspo/weight_std", "alignopsd/match_rate", "credit/weight_min", "credit/weight_max")


class ProgressPrinter(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero or "reward" not in logs:
            return
        families = " ".join(
            f"{k.split('/', 1)[1]}={v:.2f}" for k, v in sorted(logs.items()) if k.startswith("success/") and k != "success/all"
        )
        method = "".join(f" {k}={logs[k]:.3f}" for k in _METHOD_METRICS if k in logs)
        print(
            f"[step {state.global_step}/{state.max_steps}] reward={logs['reward']:.3f} "
            f"success={logs.get('success/all', float('nan')):.2f} ({families}) "
            f"turns={logs.get('env/turns_mean', float('nan')):.1f} "
            f"invalid={logs.get('env/invalid_action_rate', float('nan')):.2f} "
            f"rollout={logs.get('env/rollout_seconds', float('nan')):.1f}s loss={logs.get('loss', float('nan')):.4f}"
            f"{method}",
            flush=True,
        )
