"""AlignOPSD: decision-aligned supervision rectification and semi-Markov hierarchical credit.

The paper (`Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents`) lost its
formulas in extraction; this follows the reconstruction of ``credit/alignopsd.py`` (summarised, with the
reasons, in docs/methods.md), and every choice the prose leaves open is a config field. Only the credit hook
differs from the GRPO baseline:

1. privileged information p_x: the top-k SkillBank skills retrieved for the task (shared by the K siblings);
2. local gap g0 = log pi(y | p, h_it) - log pi(y | h_it) on every response token (privileged pass, no grad);
3. decision correspondence: each turn's ``<think>`` embedding against the turns of the sibling rollouts
   (threshold, one source per sibling, top-k, action consistency);
4. rectified gap: the same response teacher-forced under each aligned source history with p_x,
   g~ = (1 - lambda) g0 + lambda sum_j W_j g_j (identity when no source);
5. spans where the correspondence shifts (batch-adaptive threshold), evidence e_t = sign(A) mean(g~), and the
   two-level KL-regularised allocation with bounded normalisation: A~_it = A_i w_t, token-weighted mean kept.
No auxiliary distillation loss is added; the loss is TRL's token-mean ``dapo`` loss (the paper's objective).
"""

from __future__ import annotations

import logging
import random
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object

from ..credit.alignopsd import (
    ALLOCATION_MODES,
    adaptive_threshold,
    alignopsd_token_weights,
    alignopsd_weights,
    allocation_spans,
    correspondence_shifts,
    rectified_turn_gaps,
    token_gap,
    turn_evidences,
)
from ..privileged.alignment import (
    Correspondences,
    active_contexts,
    aligned_view_requests,
    batch_correspondences,
    skill_contexts,
)
from ..privileged.decisions import think_text
from ..privileged.encoder import get_encoder
from ..privileged.rescoring import privileged_prompt_ids, score_continuations
from ..privileged.skillbank import SkillBank
from ..rollout.generation import generator_for_trainer
from ..rollout.records import Trajectory
from .grpo import AgentGRPOConfig, AgentGRPOTrainer
from .step import StepView

logger = logging.getLogger(__name__)


@dataclass
class AlignOPSDConfig(AgentGRPOConfig):
    r"""Configuration of [`AlignOPSDTrainer`]: every field of [`AgentGRPOConfig`] (and `trl.GRPOConfig`), plus
    AlignOPSD's. Symbols follow the reconstructed spec; values the paper left illegible are marked.

    Parameters:
        skill_bank / skill_top_k (`AgentGRPOConfig`'s, defaults `"alfworld"` / `2`): the SkillBank of p_x (a
            shipped name or a JSONL path) and the skills retrieved per task (illegible in the paper).
        encoder_path (`str` or `None`): sentence encoder folder; `None` = the packaged all-MiniLM-L6-v2.
        similarity_threshold (`float`, defaults to `0.7`): decision-state cosine below which a source is
            dropped (illegible in the paper).
        source_top_k (`int`, defaults to `2`): $k$, aligned sources kept per target turn.
        action_threshold (`float`, defaults to `0.8`): action-embedding cosine of the consistency filter.
        exact_action_match (`bool`, defaults to `False`): also require the same operation and the identical click
            target (the paper's WebShop rule).
        rectification (`bool`, defaults to `True`): `False` is Table 2's "no rectification" ablation (g~ = g0).
        allocation (`str`, defaults to `"adaptive"`): `"adaptive"` (correspondence spans), `"turn"`, `"token"` or
            `"random"` spans (Table 2 ablations).
        credit_temperature (`float`, defaults to `1.0`): allocation temperature (illegible in the paper).
        weight_bound (`float`, defaults to `0.5`): $\epsilon$ of the bounded normalisation, $w \in [1-\epsilon, 1+\epsilon]$.
        span_min_turns / span_max_turns (`int`, defaults to `1` / `8`): span duration limits.
        span_threshold_std (`float`, defaults to `1.0`): boundary where $D_t >$ batch mean $+$ this $\times$ std.
        turn_balanced_loss: defaults to `False` here: the paper optimises the token-mean loss, and the weights
            preserve the token-weighted mean advantage.
        teacher_thinking (`bool`, defaults to `False`): teacher-side decision states: the snapshot generates a
            response to each target turn under the privileged view (p_x + h_it) and its `<think>` text, not the
            student's, is matched against the siblings' turns. One extra generation per target turn.
    """

    encoder_path: str | None = field(default=None, metadata={"help": "Sentence encoder folder."})
    similarity_threshold: float = field(default=0.7, metadata={"help": "Decision-state cosine threshold."})
    source_top_k: int = field(default=2, metadata={"help": "k: aligned sources per target turn."})
    action_threshold: float = field(default=0.8, metadata={"help": "Action-consistency cosine threshold."})
    exact_action_match: bool = field(default=False, metadata={"help": "WebShop: same operation and click target."})
    rectification: bool = field(default=True, metadata={"help": "Multi-view rectification (False: ablation)."})
    allocation: str = field(default="adaptive", metadata={"help": "adaptive | turn | token | random."})
    credit_temperature: float = field(default=1.0, metadata={"help": "Allocation temperature."})
    weight_bound: float = field(default=0.5, metadata={"help": "epsilon of the bounded normalisation."})
    span_min_turns: int = field(default=1, metadata={"help": "Shortest span (turns)."})
    span_max_turns: int = field(default=8, metadata={"help": "Longest span (turns)."})
    span_threshold_std: float = field(default=1.0, metadata={"help": "Span boundary: mean + this x std of D."})
    turn_balanced_loss: bool = field(default=False, metadata={"help": "Eq. 7 balancing (off: token-mean loss)."})
    teacher_thinking: bool = field(default=False, metadata={"help": "Match teacher-side thinking (extra generation)."})

    def __post_init__(self):
        super().__post_init__()
        if self.allocation not in ALLOCATION_MODES:
            raise ValueError(f"allocation must be one of {ALLOCATION_MODES}, got {self.allocation!r}.")
        if not 0 < self.weight_bound < 1:
            raise ValueError(f"weight_bound must be in (0, 1), got {self.weight_bound}.")
        if self.span_max_turns < 2 * self.span_min_turns - 1:
            raise ValueError("span_max_turns must be at least 2 * span_min_turns - 1 so every trajectory can be split.")


class AlignOPSDTrainer(AgentGRPOTrainer):
    """AlignOPSD. Used exactly like `trl.GRPOTrainer`, with an `AlignOPSDConfig`; `skill_bank=` and `encoder=`
    optionally pass ready objects instead of the configured ones."""

    _tag_names = ["trl", "grpo", "taspo-trl", "alignopsd"]
    _name = "AlignOPSD"
    _paper = {
        "title": "Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents",
        "citation": textwrap.dedent("""\
            @article{alignopsd,
                title = {{Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents}},
                note  = {AlignOPSD},
            }"""),
    }

    def __init__(self, *args: Any, skill_bank: SkillBank | None = None, encoder: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, AlignOPSDConfig):
            raise TypeError(f"AlignOPSDTrainer needs an AlignOPSDConfig, got {type(self.args).__name__}.")
        self.encoder = encoder or get_encoder(self.args.encoder_path)
        self.skill_bank = skill_bank or SkillBank.load(self.args.skill_bank, encoder=self.encoder)

    def turn_weights(self, step: StepView) -> list[list[float | list[float]]]:
        """Each turn's AlignOPSD weight (per token in the token ablation): the module docstring's steps 1-5, the
        equations (A1)-(A8) of docs/methods.md. ``last_step`` keeps the weights, spans and skills."""
        args = self.args
        trajectories, advantages, rows = step.trajectories, step.advantages, step.rows
        local = len(trajectories)
        everything = gather_object(trajectories) if self.accelerator.num_processes > 1 else list(trajectories)
        first = self.accelerator.process_index * local

        # p_x of every task; only trajectories whose credit can move (A_i != 0) are rescored and matched.
        started = time.perf_counter()
        skill_texts = skill_contexts(self.skill_bank, everything, args.skill_top_k)
        active = active_contexts(skill_texts[first : first + local], advantages)
        # One plain reference log pi(y | h_it) for the local gap g0 and every aligned gap g_j (A3): g~ mixes them, so
        # a reference that differed between the two would move the matched turns only.
        # Only active trajectories are rescored or matched, so only their rows need the plain side.
        local_gaps, plain = self._privileged_shifts(step, active, action_only=False)
        rescoring_seconds = time.perf_counter() - started

        # Decision correspondence over the siblings' turns (A1, A2), from the target's own thinking or, with
        # teacher_thinking, the thinking generated under p_x.
        teacher_states = self._teacher_thinking_states(trajectories, active) if args.teacher_thinking else {}
        started = time.perf_counter()
        correspondences = batch_correspondences(
            everything, first, active, self.encoder, teacher_states, exact_action_match=args.exact_action_match,
            threshold=args.similarity_threshold, top_k=args.source_top_k, action_threshold=args.action_threshold,
        )
        encoder_seconds = time.perf_counter() - started

        started = time.perf_counter()
        aligned_gaps, aligned_views = self._aligned_gaps(
            correspondences, trajectories, everything, skill_texts, rows.collect(plain)
        )
        rescoring_seconds += time.perf_counter() - started

        # Rectified gaps (A4), correspondence shifts (A5), then each trajectory's spans and weights (A5-A8).
        rectified = {
            i: rectified_turn_gaps(
                per_turn, [local_gaps.get((i, t)) for t in range(len(per_turn))],
                aligned_gaps.get(i, {}) if args.rectification else None,
            )
            for i, (per_turn, _) in correspondences.items()
        }
        shifts = {
            i: correspondence_shifts([m.distribution for m in per_turn]) if per_turn else torch.zeros(0)
            for i, (per_turn, _) in correspondences.items()
        }
        threshold = self._batch_shift_threshold(shifts)
        rng = random.Random(args.seed + self.state.global_step)
        allocations = [
            self._allocate(trajectory, rectified.get(i), float(advantages[i]), shifts.get(i), threshold, rng)
            for i, trajectory in enumerate(trajectories)
        ]
        weights = [w for w, _ in allocations]
        spans = [s for _, s in allocations]

        self.last_step.weights, self.last_step.spans = weights, spans
        self.last_step.skill_texts = skill_texts[first : first + local]
        self._log_alignment(correspondences, spans, encoder_seconds, rescoring_seconds, aligned_views)
        return weights

    def _aligned_gaps(
        self,
        correspondences: Correspondences,
        trajectories: list[Trajectory],
        everything: list[Trajectory],
        contexts: list[str],
        plain_turns: dict[tuple[int, int], torch.Tensor],
    ) -> tuple[dict[int, dict[tuple[int, int], torch.Tensor]], int]:
        """(A3) g_j of every aligned view, keyed by target trajectory, then (turn, source column), and the number of
        views. Every process scores, even nothing: the pass may be collective."""
        requests, owners = (
            aligned_view_requests(correspondences, trajectories, everything, contexts, self.chat)
            if self.args.rectification
            else ([], [])
        )
        with self._scoring_passes():
            scored = score_continuations(
                requests,
                self._snapshot_logprobs,
                self._tokenizer.pad_token_id,
                min_rows=self._max_over_processes(len(requests)),
                batch_size=self.rescore_batch_size,
            )
        gaps: dict[int, dict[tuple[int, int], torch.Tensor]] = {}
        for (i, t, source), logps in zip(owners, scored):
            gaps.setdefault(i, {})[(t, source)] = token_gap(logps, plain_turns.get((i, t), []))
        return gaps, len(requests)

    def _batch_shift_threshold(self, shifts: dict[int, torch.Tensor]) -> float:
        """(A5) The span boundary threshold over every correspondence shift of the whole batch (all processes)."""
        local = [s.tolist() for s in shifts.values()]
        everyone = gather_object(local) if self.accelerator.num_processes > 1 else local
        return adaptive_threshold([torch.tensor(s, dtype=torch.float64) for s in everyone], self.args.span_threshold_std)

    def _allocate(
        self,
        trajectory: Trajectory,
        gaps: list[torch.Tensor | None] | None,
        advantage: float,
        shifts: torch.Tensor | None,
        threshold: float,
        rng: random.Random,
    ) -> tuple[list[float | list[float]], list[tuple[int, int]]]:
        """(A5)-(A8) for one trajectory: its weights (per turn, or per token in the token ablation) and credit spans.
        A trajectory that was not matched (``gaps`` None) keeps GRPO's uniform credit."""
        args = self.args
        n_turns = trajectory.num_turns
        if gaps is None or n_turns == 0:
            return [1.0] * n_turns, ([(0, n_turns)] if n_turns else [])
        if args.allocation == "token":
            token_w = alignopsd_token_weights(gaps, advantage, args.credit_temperature, args.weight_bound)
            return [w.tolist() if w.numel() else 1.0 for w in token_w], [(t, t + 1) for t in range(n_turns)]
        spans = allocation_spans(
            args.allocation, n_turns, shifts=shifts, threshold=threshold, rng=rng,
            min_len=args.span_min_turns, max_len=args.span_max_turns,
        )
        evidence = turn_evidences(gaps, advantage)
        counts = [len(turn.response_ids) for turn in trajectory.turns]
        return alignopsd_weights(evidence, counts, spans, args.credit_temperature, args.weight_bound).tolist(), spans

    def _log_alignment(
        self,
        correspondences: Correspondences,
        spans: list[list[tuple[int, int]]],
        encoder_seconds: float,
        rescoring_seconds: float,
        aligned_views: int,
    ) -> None:
        metrics = self._metrics["train" if self.model.training else "eval"]
        matches = [match for per_turn, _ in correspondences.values() for match in per_turn]
        similarities = [s for match in matches for s in match.similarities.tolist()]
        metrics["alignopsd/match_rate"].append(sum(not m.is_identity for m in matches) / max(len(matches), 1))
        metrics["alignopsd/lambda_mean"].append(sum(m.quality for m in matches) / max(len(matches), 1))
        if similarities:
            metrics["alignopsd/similarity_mean"].append(sum(similarities) / len(similarities))
        span_lengths = [end - start for trajectory_spans in spans for start, end in trajectory_spans]
        metrics["alignopsd/span_count"].append(sum(len(s) for s in spans) / max(len(spans), 1))
        metrics["alignopsd/span_length_mean"].append(sum(span_lengths) / max(len(span_lengths), 1))
        metrics["alignopsd/encoder_seconds"].append(encoder_seconds)
        metrics["alignopsd/rescoring_seconds"].append(rescoring_seconds)
        metrics["alignopsd/aligned_views"].append(float(aligned_views))

    def _teacher_thinking_states(self, trajectories: list[Trajectory], contexts: list[str]) -> dict[int, torch.Tensor]:
        """Per trajectory with a context, the encoded ``<think>`` text the snapshot writes for each of its turns
        under the privileged view. One batched generation over all of them; every process calls it once, with
        an empty list if it has nothing to generate, as a collective vLLM server call needs."""
        started = time.perf_counter()
        keys = [(i, t) for i, trajectory in enumerate(trajectories) if contexts[i] for t in range(trajectory.num_turns)]
        prompts = [privileged_prompt_ids(trajectories[i], t, contexts[i], self.chat) for i, t in keys]
        generations = generator_for_trainer(self, batch_size=self.args.rollout_batch_size)(prompts)
        texts = [think_text(self._tokenizer.decode(g.token_ids, skip_special_tokens=True)) or "(no reasoning)" for g in generations]
        encoded = self.encoder.encode(texts) if texts else None
        states: dict[int, list[torch.Tensor]] = {}
        for row, (i, _) in enumerate(keys):
            states.setdefault(i, []).append(encoded[row])
        self._metrics["train" if self.model.training else "eval"]["alignopsd/teacher_thinking_seconds"].append(
            time.perf_counter() - started
        )
        return {i: torch.stack(rows) for i, rows in states.items()}
