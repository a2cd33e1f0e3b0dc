"""Training rows from trajectories, in the two layouts (step 4 of a training step, see ``trainers/grpo.py``).

- ``sequence``: one row per trajectory. The completion is every response with the observation tokens that
  followed it, which are masked out (``env_mask`` 0). Exactly the tokens the policy was conditioned on.
- ``turn``: one row per turn, each with its own prompt. Rows are padded with empty, fully masked rows to a
  multiple of ``pad_to_multiple`` so TRL can split the generation batch evenly.

Every completion token remembers which (trajectory, turn) produced it, so per-turn credit (TASPO and
AlignOPSD weights, Eq. 7's balancing factor) can be spread onto exactly that turn's policy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .records import Trajectory

NOT_POLICY = -1


@dataclass
class Rows:
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    env_mask: list[list[int]] = field(default_factory=list)
    """1 for tokens the policy generated, 0 for observation tokens and padding rows."""
    logprobs: list[list[float]] = field(default_factory=list)
    """Sampling log-probs; 0.0 where ``env_mask`` is 0."""
    token_turn: list[list[int]] = field(default_factory=list)
    """The turn index of each completion token, ``NOT_POLICY`` for observation tokens."""
    row_trajectory: list[int] = field(default_factory=list)
    """The trajectory index of each row, ``NOT_POLICY`` for padding rows."""

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def _append(self, trajectory: int, prompt, completion, mask, logprobs, turns) -> None:
        self.prompt_ids.append(list(prompt))
        self.completion_ids.append(list(completion))
        self.env_mask.append(list(mask))
        self.logprobs.append(list(logprobs))
        self.token_turn.append(list(turns))
        self.row_trajectory.append(trajectory)

    def append_padding(self, pad_token_id: int) -> None:
        """An empty row: one pad token, fully masked, belonging to no trajectory."""
        self._append(NOT_POLICY, [pad_token_id], [pad_token_id], [0], [0.0], [NOT_POLICY])

    def spread(self, per_turn: Sequence[Sequence[float | Sequence[float]]], fill: float = 0.0) -> list[list[float]]:
        """Per-token values from per-turn ones.

        ``per_turn[i][t]`` is either one number for every policy token of turn t of trajectory i, or a list
        with one number per response token of that turn (token-level allocation). Observation and padding
        tokens get ``fill``.
        """
        out = []
        for traj, turns in zip(self.row_trajectory, self.token_turn, strict=True):
            values, position = [], {}
            for turn in turns:
                if traj == NOT_POLICY or turn == NOT_POLICY:
                    values.append(fill)
                    continue
                value = per_turn[traj][turn]
                if isinstance(value, (int, float)):
                    values.append(float(value))
                else:
                    k = position.get(turn, 0)
                    values.append(float(value[k]))
                    position[turn] = k + 1
            out.append(values)
        return out


    def collect(self, values: Sequence[torch.Tensor]) -> dict[tuple[int, int], torch.Tensor]:
        """The inverse of ``spread``: per-token row values (e.g. log-probs; one 1-D tensor per row, or a padded
        [rows, T] tensor, with at least as many values as the row has completion tokens) regrouped per
        (trajectory, turn), in response-token order, as 1-D tensors of ``values``' dtype."""
        parts: dict[tuple[int, int], list[torch.Tensor]] = {}
        for traj, turns, row_values in zip(self.row_trajectory, self.token_turn, values, strict=True):
            if traj == NOT_POLICY:
                continue
            turn_of_token = torch.tensor(turns)
            for turn in dict.fromkeys(t for t in turns if t != NOT_POLICY):  # a row's turns, in order
                parts.setdefault((traj, turn), []).append(row_values[: len(turns)][turn_of_token == turn])
        return {key: chunks[0] if len(chunks) == 1 else torch.cat(chunks) for key, chunks in parts.items()}

    def select(self, keep: Sequence[int]) -> "Rows":
        """A new ``Rows`` with only the rows at indices ``keep`` (in that order)."""
        sub = Rows()
        for r in keep:
            sub._append(
                self.row_trajectory[r], self.prompt_ids[r], self.completion_ids[r], self.env_mask[r],
                self.logprobs[r], self.token_turn[r],
            )
        return sub


def build_rows(
    trajectories: Sequence[Trajectory],
    layout: str,
    pad_to_multiple: int = 1,
    min_rows: int = 0,
    pad_token_id: int = 0,
) -> Rows:
    """Rows of ``trajectories`` in ``layout``; ``turn`` rows are padded to at least ``min_rows`` rows and to a
    multiple of ``pad_to_multiple`` with empty, fully masked rows."""
    if layout == "sequence":
        return _sequence_rows(trajectories, pad_token_id)
    if layout == "turn":
        rows = _turn_rows(trajectories)
        while len(rows) < max(min_rows, 1) or len(rows) % max(pad_to_multiple, 1):
            rows.append_padding(pad_token_id)
        return rows
    raise ValueError(f"Unknown layout {layout!r}: use 'turn' or 'sequence'.")


def _sequence_rows(trajectories: Sequence[Trajectory], pad_token_id: int) -> Rows:
    rows = Rows()
    for i, trajectory in enumerate(trajectories):
        if not trajectory.turns:  # the environment failed before the first turn: a row that trains nothing
            rows._append(i, [pad_token_id], [pad_token_id], [0], [0.0], [NOT_POLICY])
            continue
        prompt = trajectory.turns[0].prompt_ids
        completion, mask, logprobs, turns = [], [], [], []
        context = list(prompt)
        for t, turn in enumerate(trajectory.turns):
            if t > 0:
                if turn.prompt_ids[: len(context)] != context:
                    raise RuntimeError(
                        f"Trajectory {i}, turn {t}: the prompt does not extend the previous turn's history; "
                        "sequence-layout rows would not be the tokens the policy saw."
                    )
                observation = turn.prompt_ids[len(context) :]
                completion += observation
                mask += [0] * len(observation)
                logprobs += [0.0] * len(observation)
                turns += [NOT_POLICY] * len(observation)
            completion += turn.response_ids
            mask += [1] * len(turn.response_ids)
            logprobs += turn.logprobs
            turns += [t] * len(turn.response_ids)
            context = turn.prompt_ids + turn.response_ids
        rows._append(i, prompt, completion, mask, logprobs, turns)
    return rows


def _turn_rows(trajectories: Sequence[Trajectory]) -> Rows:
    rows = Rows()
    for i, trajectory in enumerate(trajectories):
        for t, turn in enumerate(trajectory.turns):
            n = len(turn.response_ids)
            rows._append(i, turn.prompt_ids, turn.response_ids, [1] * n, turn.logprobs, [t] * n)
    return rows
