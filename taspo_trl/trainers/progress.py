"""One readable progress line per logged step: reward, success per task family, rollout time, and the credit
method's own evidence that it redistributed credit (PI coverage, weight spread, decision matches)."""

from __future__ import annotations

from transformers import TrainerCallback

# Shown when the method logs them: TASPO's PI coverage and weight spread, AlignOPSD's match rate, and the range of
# the per-turn weights that every redistribution method logs.
_METHOD_METRICS = ("pi/coverage", "taspo/weight_std", "alignopsd/match_rate", "credit/weight_min", "credit/weight_max")


def _shown(value: object, spec: str) -> str:
    """``value`` formatted with ``spec``; "n/a" where there is no number (TRL logs None for a metric whose every
    value was NaN, e.g. the reward of a batch no reward function scored)."""
    try:
        return format(float(value), spec)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "n/a"


class ProgressPrinter(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero or "reward" not in logs:
            return
        families = " ".join(
            f"{k.split('/', 1)[1]}={_shown(v, '.2f')}"
            for k, v in sorted(logs.items())
            if k.startswith("success/") and k != "success/all"
        )
        method = "".join(f" {k}={_shown(logs[k], '.3f')}" for k in _METHOD_METRICS if k in logs)
        errors = logs.get("env/error_rate")
        faults = f" env_errors={_shown(errors, '.2f')}" if isinstance(errors, (int, float)) and errors > 0 else ""
        print(
            f"[step {state.global_step}/{state.max_steps}] reward={_shown(logs['reward'], '.3f')} "
            f"success={_shown(logs.get('success/all'), '.2f')} ({families}) "
            f"turns={_shown(logs.get('env/turns_mean'), '.1f')} "
            f"invalid={_shown(logs.get('env/invalid_action_rate'), '.2f')} "
            f"rollout={_shown(logs.get('env/rollout_seconds'), '.1f')}s loss={_shown(logs.get('loss'), '.4f')}"
            f"{faults}{method}",
            flush=True,
        )
