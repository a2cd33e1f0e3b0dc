"""Trajectory and turn records: what one rollout of the agent loop leaves behind.

Everything later stages need is here: the exact token ids the policy saw and produced (so the trainer's
recomputed log-probs match the sampling ones), the located action span (TASPO A.3), the observations
(the analyzer's evidence) and the verified terminal reward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Turn:
    """One agent turn: the prompt it was generated from, the response, and the environment's answer."""

    prompt_ids: list[int]
    """Token ids the policy was conditioned on. In the ``sequence`` layout this is the whole history so far."""
    response_ids: list[int]
    logprobs: list[float]
    """Sampling log-probability of each response token (log-softmax of logits / temperature)."""
    response_text: str
    action: str
    """The action sent to the environment ("" when the response had no valid action block)."""
    action_valid: bool
    action_reason: str
    action_span: tuple[int, int]
    """[start, end) token positions of the action block in ``response_ids``; (0, 0) when none was found."""
    observation: str
    """The environment's answer to this turn's action."""
    prompt_text: str = ""
    """The user message of this turn (``turn`` layout: the full templated prompt text; ``sequence``: the new
    observation message). Kept so a privileged view can be rebuilt around it."""
    reward: float = 0.0


@dataclass
class Trajectory:
    """One rollout of one task: K siblings of the same task share ``group``."""

    task_spec: dict[str, Any]
    task: str
    initial_observation: str
    group: int
    env_name: str = ""
    task_type: str | None = None
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    """Verified terminal reward (ALFWorld: 1.0 on success)."""
    won: bool = False
    truncated: bool = False
    """True when the episode hit the turn or context limit before the environment ended it."""
    error: str | None = None
    """Set when the environment failed (worker crash, exception); the trajectory then ends with reward 0."""
    faults: list[str] = field(default_factory=list)
    """Faults of steps that went on (a step's ``info["retrieval_error"]``, or any other ``info`` key ending in
    ``_error``): the episode continued on a failure message, so it counts as failed in ``env/error_rate``, the
    error guard and taspo-eval's error count, like one with ``error``."""

    @property
    def had_fault(self) -> bool:
        """Whether the environment failed during this episode, at the end (``error``) or on the way (``faults``)."""
        return self.error is not None or bool(self.faults)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
