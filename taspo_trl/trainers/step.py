"""The two per-step records of the agent trainers: what a credit hook sees of a step (``StepView``), and what
the trainer keeps of its latest step for inspection (``LastStep``, ``trainer.last_step``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..credit.turns import TurnCredit
from ..rollout.layouts import Rows
from ..rollout.records import Trajectory


@dataclass
class StepView:
    """This process's share of one training step, as the credit hooks (``turn_weights``, ``turn_advantages``)
    receive it.

    Attributes:
        trajectories: the episodes played, K consecutive siblings per task group.
        advantages: A_i of each trajectory (float32, on the CPU), this process's slice of the group-normalised
            outcome advantages.
        rows: the training rows laid out from ``trajectories``; ``rows.row_trajectory`` and ``rows.token_turn``
            say which (trajectory, turn) each completion token of ``batch`` belongs to.
        batch: the padded tensors of ``rows`` (``prompt_ids``, ``completion_ids``, their masks,
            ``sampling_per_token_logps`` and, when TRL's loss needs them, ``old_per_token_logps`` /
            ``ref_per_token_logps``), one row per entry of ``rows``. Per-token data stays in these tensors.
        rewards: the rewards of every trajectory of the step, all processes' (gathered, in process order);
            AlignOPSD's outcome advantage takes its own statistics over them.
        first: where this process's trajectories start in the step's batch of all processes (the index of
            ``trajectories[0]`` in ``everything``, ``rewards`` and ``batch_advantages``).
        batch_advantages: A_i of every trajectory of the step, all processes' (``advantages`` is the slice of
            this process); defaults to ``advantages`` (one process).
        everything: every process's trajectories of the step, in process order, gathered once by the step (a
            hook never gathers); defaults to ``trajectories`` (one process).
        mode: "train" or "eval": the key of TRL's ``_metrics`` that a hook logs this step's metrics to.
    """

    trajectories: list[Trajectory]
    advantages: torch.Tensor
    rows: Rows
    batch: dict[str, Any]
    rewards: torch.Tensor | None = None
    first: int = 0
    batch_advantages: torch.Tensor | None = None
    everything: list[Trajectory] | None = field(default=None, repr=False)
    mode: str = "train"

    def __post_init__(self) -> None:
        if self.batch_advantages is None:
            self.batch_advantages = self.advantages
        if self.everything is None:
            self.everything = list(self.trajectories)

    @property
    def local(self) -> slice:
        """Where this process's trajectories sit in ``everything`` (and in any list over the whole batch)."""
        return slice(self.first, self.first + len(self.trajectories))

    @property
    def groups(self) -> dict[int, list[int]]:
        """The members of each task group: positions in ``everything``, by the group id of their trajectories."""
        members: dict[int, list[int]] = {}
        for j, trajectory in enumerate(self.everything):
            members.setdefault(trajectory.group, []).append(j)
        return members


@dataclass
class LastStep:
    """What the trainer built in its latest step, kept for inspection (notebooks, tests); ``trainer.last_step``.
    One entry per trajectory of this process in every list; a field the trainer's method does not produce stays
    empty.

    Attributes:
        trajectories: the episodes of the step (every trainer).
        privileged_info: TASPO's P_i, or a baseline teacher's privileged context; "" where there was none.
        weights: TASPO's or AlignOPSD's weight of each turn (a list with one weight per response token where the
            token-level ablation gave the turn its own token weights).
        spans: AlignOPSD's credit spans of each trajectory, ``(first turn, end turn)`` pairs.
        skill_texts: AlignOPSD's retrieved skills p_x of each trajectory's task.
        step_skills: OPID's step skills of each trajectory, keyed by turn.
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    privileged_info: list[str] = field(default_factory=list)
    weights: TurnCredit = field(default_factory=TurnCredit)
    spans: list[list[tuple[int, int]]] = field(default_factory=list)
    skill_texts: list[str] = field(default_factory=list)
    step_skills: list[dict[int, str]] = field(default_factory=list)
