"""The registered credit methods called directly, as ``BaselineTrainer`` calls them (``credit.registry``), on
tiny hand-made batches: fast checks of what the slow end-to-end tests
(``tests/trainers/test_credit_reaches_loss.py``) cover.

Each adapter reads its settings from the trainer config and forwards them, with the batch or the teacher gaps, to
the pure functions of ``credit.baselines`` and ``credit.distillation``. ``args`` here is a ``SimpleNamespace``
holding only the ``BaselineConfig`` fields the method reads, each set to a value that is neither the field's
default nor the pure function's default, and distinct from the others, so a field that is ignored, swapped or
left to a default changes the result. Every expected number is worked out by hand in the test's docstring."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from taspo_trl.credit.registry import (
    CREDIT_METHODS,
    TEACHERS,
    CreditMethod,
    OutcomeBatch,
    TeacherGaps,
    get_credit,
    register_credit,
    register_method,
)

BUILT_INS = ("gigpo", "grpo_opsd", "opd", "opid", "opsd", "rlsd", "sdar", "skill_grpo", "skill_sd", "stepopsd")
H = math.log(3.0) / 2  # sigmoid(2 H) = 3/4, sigmoid(-2 H) = 1/4
R2 = math.sqrt(2.0)
R15 = math.sqrt(15.0)
Registry = dict[str, CreditMethod]


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern that matches ``message`` and nothing longer or shorter."""
    return f"^{re.escape(message)}$"


def teacher_gaps(
    advantage: float, delta: list[list[float]], mask: list[list[float]], step_delta: list[list[float]] | None = None
) -> TeacherGaps:
    """One trajectory's teacher pass as the trainer builds it: A on every turn, the student's log-probs (not
    read by the methods' advantages at the rollout snapshot, so arbitrary here) and 0 step gaps by default."""
    shape = torch.tensor(mask).shape
    return TeacherGaps(
        advantage=torch.full((shape[0],), advantage),
        delta=torch.tensor(delta),
        mask=torch.tensor(mask),
        student=torch.linspace(-3.0, -0.5, shape.numel()).reshape(shape),
        step_delta=torch.zeros(shape) if step_delta is None else torch.tensor(step_delta),
    )


def assert_tensor(actual: torch.Tensor, expected: list[list[float]]) -> None:
    """``actual`` equals the hand-computed ``expected`` up to float32 rounding."""
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------------------
# registration and lookup


@pytest.fixture
def registry() -> Iterator[Registry]:
    """The registry, restored after the test (whatever it registered is removed)."""
    before = dict(CREDIT_METHODS)
    try:
        yield CREDIT_METHODS
    finally:
        CREDIT_METHODS.clear()
        CREDIT_METHODS.update(before)


def first_method(batch: OutcomeBatch, args: SimpleNamespace, step: int) -> list[list[float]]:
    """A user's credit method: 1 on every turn."""
    return [[1.0] * len(rewards) for rewards in batch.rewards]


def second_method(batch: OutcomeBatch, args: SimpleNamespace, step: int) -> list[list[float]]:
    """Another function, for the taken-name check."""
    return [[2.0] * len(rewards) for rewards in batch.rewards]


def test_the_comparison_methods_are_registered_with_their_call_convention() -> None:
    """Every built-in is registered under its name with the adapter the trainer calls; GiGPO and Skill-GRPO take
    the outcome batch, OPD an external teacher, the rest the self-teacher; OPSD and OPD are distillation only."""
    assert set(BUILT_INS) <= set(CREDIT_METHODS)
    for name in BUILT_INS:
        method = CREDIT_METHODS[name]
        assert method.name == name and method.fn.__name__ == f"{name}_credit"
    assert {n: CREDIT_METHODS[n].teacher for n in BUILT_INS} == {
        **{n: "self" for n in BUILT_INS}, "gigpo": None, "skill_grpo": None, "opd": "external"
    }
    assert {n for n in BUILT_INS if not CREDIT_METHODS[n].outcome} == {"opsd", "opd"}


def test_register_credit_stores_the_name_trimmed_and_lower_case_and_titles_it_so(registry: Registry) -> None:
    """Surrounding spaces go and case folds, in the key, the method's name and its default title; the function
    comes back unchanged, and the lookup folds its argument the same way."""
    assert register_credit("  Adapter_Test  ", first_method) is first_method
    method = registry["adapter_test"]
    assert (method.name, method.fn, method.title) == ("adapter_test", first_method, "adapter_test")
    assert method.teacher is None
    assert get_credit("  ADAPTER_test ") is method


def test_register_credit_keeps_every_setting_it_is_given(registry: Registry) -> None:
    """The ``CreditMethod`` settings reach the entry, a given title replacing the default one."""
    register_credit("adapter_test", first_method, teacher="self", outcome=False, distill_coef=0.3, title="Mine")
    method = registry["adapter_test"]
    assert (method.teacher, method.outcome, method.distill_coef, method.title) == ("self", False, 0.3, "Mine")


def test_register_credit_as_a_decorator_registers_and_returns_the_function(registry: Registry) -> None:
    """``register_credit(name, **spec)`` without a function is a decorator that leaves the function as it is."""
    assert register_credit("Adapter_Test", teacher="external")(first_method) is first_method
    assert registry["adapter_test"].fn is first_method and registry["adapter_test"].teacher == "external"


def test_registering_the_same_function_again_is_a_no_op(registry: Registry) -> None:
    """A second registration of the same function under the same name and settings leaves an equal entry."""
    register_credit("adapter_test", first_method, title="Mine")
    entry = registry["adapter_test"]
    assert register_credit("ADAPTER_TEST", first_method, title="Mine") is first_method
    assert registry["adapter_test"] == entry


def test_a_taken_name_is_refused_and_keeps_its_method(registry: Registry) -> None:
    """Another function under a taken name (in any case) is refused, naming the method already there."""
    register_credit("adapter_test", first_method)
    with pytest.raises(ValueError, match=exactly(
        "credit method 'adapter_test' is already registered (first_method); pick another name."
    )):
        register_credit("Adapter_Test", second_method)
    assert registry["adapter_test"].fn is first_method


def test_the_trainers_own_methods_share_the_registry_with_their_classes(registry: Registry) -> None:
    """GRPO, TASPO and AlignOPSD are entries of the same table as the credit functions: no function, their config
    and trainer classes, and ``method_classes`` resolves every name through it (a credit function to
    ``BaselineConfig``/``BaselineTrainer``)."""
    from taspo_trl.trainers import (AgentGRPOConfig, AgentGRPOTrainer, AlignOPSDConfig, AlignOPSDTrainer,
                                    BaselineConfig, BaselineTrainer, TASPOConfig, TASPOTrainer, method_classes,
                                    method_names)

    own = {"grpo": (AgentGRPOConfig, AgentGRPOTrainer), "taspo": (TASPOConfig, TASPOTrainer),
           "alignopsd": (AlignOPSDConfig, AlignOPSDTrainer)}
    for name, classes in own.items():
        assert registry[name].fn is None and (registry[name].config, registry[name].trainer) == classes
        assert method_classes(name) == classes
    assert method_names()[:3] == ["grpo", "taspo", "alignopsd"] and set(method_names()) == set(registry)
    assert all(method_classes(name) == (BaselineConfig, BaselineTrainer) for name in BUILT_INS)


def test_register_method_keeps_a_taken_name(registry: Registry) -> None:
    """A trainer registered again under its name is a no-op; another trainer, or a credit function, under a taken
    name is refused naming what holds it; a user's trainer registers with its classes and settings."""
    from taspo_trl.trainers import TASPOConfig, TASPOTrainer, method_classes

    entry = registry["taspo"]
    register_method("TASPO", config=TASPOConfig, trainer=TASPOTrainer, title="TASPO", summary=entry.summary)
    assert registry["taspo"] == entry
    with pytest.raises(ValueError, match=exactly(
        "credit method 'taspo' is already registered (TASPOTrainer); pick another name."
    )):
        register_method("taspo", config=TASPOConfig, trainer=SimpleNamespace)
    with pytest.raises(ValueError, match=r"credit method 'taspo' is already registered \(TASPOTrainer\)"):
        register_credit("taspo", first_method)
    register_method(" Mine_Trainer ", config=TASPOConfig, trainer=TASPOTrainer, title="Mine", summary="a test")
    assert (registry["mine_trainer"].title, registry["mine_trainer"].summary) == ("Mine", "a test")
    assert method_classes("mine_trainer") == (TASPOConfig, TASPOTrainer)
    with pytest.raises(ValueError, match=exactly("register_method needs a non-empty name.")):
        register_method(" ", config=TASPOConfig, trainer=TASPOTrainer)


@pytest.mark.parametrize("name", ["", "   "])
def test_register_credit_refuses_an_empty_name(registry: dict, name: str) -> None:
    """A name that is empty once trimmed is refused, and nothing is registered."""
    before = dict(registry)
    with pytest.raises(ValueError, match=exactly("register_credit needs a non-empty name.")):
        register_credit(name, first_method)
    assert registry == before


def test_register_credit_refuses_an_unknown_teacher(registry: Registry) -> None:
    """A teacher outside ``TEACHERS`` is refused with the allowed values, and nothing is registered."""
    assert TEACHERS == (None, "self", "external")
    with pytest.raises(ValueError, match=exactly("teacher must be one of (None, 'self', 'external'), got 'ema'.")):
        register_credit("adapter_test", first_method, teacher="ema")
    assert "adapter_test" not in registry


@pytest.mark.parametrize("name", ["nope", " Gigpo2 "])
def test_an_unknown_name_is_refused_with_the_known_names_in_order(name: str) -> None:
    """The lookup error repeats the name as given and lists the registered names sorted, comma-separated (the
    built-ins, and any a test of this process left registered)."""
    known = ", ".join(sorted(CREDIT_METHODS))
    with pytest.raises(ValueError, match=exactly(f"unknown credit method {name!r}; known: {known}")):
        get_credit(name)


# --------------------------------------------------------------------------------------------------------------
# teacher-free methods: fn(OutcomeBatch, args, step) -> per-turn advantages


def test_skill_grpo_gives_each_trajectory_its_outcome_advantage_on_every_turn() -> None:
    """A_i repeated once per turn (the number of rewards), as Python floats: [0.5] * 3 and [-1.5] * 1. The
    observations, groups, config and step play no part."""
    batch = OutcomeBatch(
        advantages=torch.tensor([0.5, -1.5]),
        observations=[["a", "b", "c"], ["a"]],
        rewards=[[0.0, 0.0, 1.0], [0.0]],
        groups=[0, 0],
    )
    credit = get_credit("skill_grpo").fn(batch, SimpleNamespace(), 7)
    assert credit == [[0.5, 0.5, 0.5], [-1.5]]
    assert all(type(value) is float for turns in credit for value in turns)


def test_skill_grpo_refuses_advantages_and_rewards_of_different_lengths() -> None:
    """Two advantages for one trajectory's rewards is a broken batch, not a shorter result."""
    batch = OutcomeBatch(advantages=torch.tensor([0.5, -1.5]), observations=[["a"]], rewards=[[0.0]], groups=[0])
    with pytest.raises(ValueError):
        get_credit("skill_grpo").fn(batch, SimpleNamespace(), 0)


def test_gigpo_combines_its_episode_and_step_terms_with_every_config_setting() -> None:
    """One task group of three 2-turn trajectories, gamma 0.5, omega 0.5, norm "mean_std", similarity 0.8.

    Rewards [1, 0], [0, 1], [0, 0]: returns R = [1, 0], [0.5, 1], [0, 0] (R_0 = r_0 + 0.5 r_1).
    Episode term over the group's step rows [1, 1, 1, 1, 0, 0]: mean 2/3, unbiased std sqrt((4/9 + 8/9) / 5)
    = 2 / sqrt(15), so A_E = (1/3) sqrt(15)/2 = sqrt(15)/6 for the two successes and -(2/3) sqrt(15)/2 = -sqrt(15)/3.
    Step term: "start" is shared by all three, returns {1, 0.5, 0}, mean 0.5, std 0.5: A_S = +1, 0, -1. At turn 1
    "room a" and "room b" match (SequenceMatcher ratio 10/12 >= 0.8; "hall" matches neither, ratio <= 0.22):
    returns {0, 1}, mean 0.5, std sqrt(1/2): A_S = -1/sqrt(2), +1/sqrt(2); "hall" alone has A_S = 0.
    A = A_E + 0.5 A_S. Each setting left at its default changes the numbers (gamma 0.95: returns {1, 0.95, 0};
    omega 1; norm "mean": no division; exact matching: "room a" and "room b" alone, so 0). ``batch.advantages``
    is not read."""
    batch = OutcomeBatch(
        advantages=torch.tensor([9.0, 9.0, 9.0]),
        observations=[["start", "room a"], ["start", "room b"], ["start", "hall"]],
        rewards=[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
        groups=[3, 3, 3],
    )
    args = SimpleNamespace(gigpo_omega=0.5, gigpo_gamma=0.5, gigpo_norm="mean_std", gigpo_similarity_threshold=0.8)
    credit = get_credit("gigpo").fn(batch, args, 0)
    expected = [
        [R15 / 6 + 0.5, R15 / 6 - 0.5 / R2],
        [R15 / 6, R15 / 6 + 0.5 / R2],
        [-R15 / 3 - 0.5, -R15 / 3],
    ]
    assert len(credit) == 3 and all(type(turns) is list for turns in credit)
    for turns, hand in zip(credit, expected, strict=True):
        assert turns == pytest.approx(hand, abs=1e-5)  # the std + 1e-6 of "mean_std"


# --------------------------------------------------------------------------------------------------------------
# teacher methods: fn(TeacherGaps, args, step) -> [turns, T] per-token advantages


# Two turns, three and one scored tokens; the gaps make sigmoid(beta Delta) = 3/4, 1/4, 1/2 for beta = 2.
DELTA = [[H, -H, 0.0], [0.5, 0.0, 0.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


@pytest.mark.parametrize("name", ["opsd", "opd"])
def test_reverse_kl_distillation_alone_is_the_coefficient_times_the_gap(name: str) -> None:
    """OPSD and OPD: the gradient-equivalent advantage of coef (log pi - sg(log pi_T)) is coef Delta on the scored
    tokens, with no outcome term: 0.3 [H, -H] and 0.3 * 0.5 = 0.15, 0 elsewhere (A = 2 is not added)."""
    gaps = teacher_gaps(2.0, DELTA, MASK)
    shaped = get_credit(name).fn(gaps, SimpleNamespace(distill_coef=0.3), 0)
    assert_tensor(shaped, [[0.3 * H, -0.3 * H, 0.0], [0.15, 0.0, 0.0]])


def test_grpo_opsd_adds_the_outcome_advantage_on_the_scored_tokens() -> None:
    """GRPO+OPSD: A + coef Delta on the scored tokens and 0 on padding: 2 + 0.3 [H, -H], 2 + 0.15."""
    gaps = teacher_gaps(2.0, DELTA, MASK)
    shaped = get_credit("grpo_opsd").fn(gaps, SimpleNamespace(distill_coef=0.3), 0)
    assert_tensor(shaped, [[2.0 + 0.3 * H, 2.0 - 0.3 * H, 0.0], [2.15, 0.0, 0.0]])


def test_sdar_adds_the_coefficient_times_the_gate_of_beta_times_the_gap() -> None:
    """SDAR with coef 0.2, beta 2: A + 0.2 sigmoid(2 Delta), i.e. -1 + 0.2 [3/4, 1/4] = [-0.85, -0.95] and
    -1 + 0.2 sigmoid(1) on the second turn (SDAR's own defaults, 0.01 and 5, give other numbers)."""
    gaps = teacher_gaps(-1.0, DELTA, MASK)
    shaped = get_credit("sdar").fn(gaps, SimpleNamespace(distill_coef=0.2, sdar_beta=2.0), 0)
    assert_tensor(shaped, [[-0.85, -0.95, 0.0], [-1.0 + 0.2 / (1.0 + math.exp(-1.0)), 0.0, 0.0]])


def test_skill_sd_weights_the_reverse_kl_by_the_clipped_importance_weight() -> None:
    """Skill-SD, coef 0.4, importance clip 0.5: at the rollout snapshot pi / pi_old = 1, clipped to 0.5, so the
    advantage is A + 0.5 * 0.4 Delta = 1 + 0.2 Delta: 1 + 0.2 [H, -H] and 1.1 (the default clip 2 would keep the
    weight at 1: 1 + 0.4 Delta)."""
    gaps = teacher_gaps(1.0, DELTA, MASK)
    shaped = get_credit("skill_sd").fn(gaps, SimpleNamespace(distill_coef=0.4, skill_sd_is_clip=0.5), 0)
    assert_tensor(shaped, [[1.0 + 0.2 * H, 1.0 - 0.2 * H, 0.0], [1.1, 0.0, 0.0]])


def test_rlsd_reweights_the_outcome_by_the_clipped_teacher_ratio_at_the_scheduled_lambda() -> None:
    """RLSD, lambda_0 0.8 over 4 steps at step 1: lambda = 0.8 (1 - 2/4) = 0.4; clip 0.1, A = 2.

    A_hat = 2 (0.6 + 0.4 clip(exp(Delta), 0.9, 1.1)): Delta = 1 clips to 1.1 -> 2.08, Delta = -1 to 0.9 -> 1.92,
    Delta = 0.05 stays exp(0.05) -> 1.2 + 0.8 exp(0.05), Delta = 0 -> 2; 0 on padding."""
    gaps = teacher_gaps(2.0, [[1.0, -1.0, 0.05], [0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    args = SimpleNamespace(rlsd_lambda=0.8, rlsd_decay_steps=4, rlsd_clip=0.1)
    shaped = get_credit("rlsd").fn(gaps, args, 1)
    assert_tensor(shaped, [[2.08, 1.92, 1.2 + 0.8 * math.exp(0.05)], [2.0, 0.0, 0.0]])


def test_rlsd_is_grpo_once_its_lambda_has_decayed() -> None:
    """At step 3 of a 4-step decay lambda = 0.8 max(0, 1 - 4/4) = 0: A on every scored token, whatever the gap."""
    gaps = teacher_gaps(2.0, [[1.0, -1.0]], [[1.0, 1.0]])
    shaped = get_credit("rlsd").fn(gaps, SimpleNamespace(rlsd_lambda=0.8, rlsd_decay_steps=4, rlsd_clip=0.1), 3)
    assert_tensor(shaped, [[2.0, 2.0]])


@pytest.mark.parametrize("step,lam", [(0, 0.6), (1, 0.4), (3, 0.0), (10, 0.0)])
def test_rlsd_reports_its_lambda_at_the_step(step: int, lam: float) -> None:
    """RLSD's metric is lambda_0 max(0, 1 - (step + 1) / decay): 0.8 (1 - 1/4) = 0.6, 0.8 (1 - 2/4) = 0.4,
    then 0 from step 3 on; the other methods report no extra metric."""
    metrics = get_credit("rlsd").metrics(SimpleNamespace(rlsd_lambda=0.8, rlsd_decay_steps=4), step)
    assert metrics == {"baseline/rlsd_lambda": pytest.approx(lam)}
    assert all(CREDIT_METHODS[name].metrics is None for name in BUILT_INS if name != "rlsd")


def test_opid_adds_the_weighted_episode_and_step_gaps() -> None:
    """OPID, episode weight 0.5, step weight 0.25, A = 1: A + 0.5 Delta + 0.25 Delta_step per token:
    1 + 0.1 + 0.2 = 1.3, 1 - 0.2 + 0 = 0.8, 1 + 0.5 - 0.1 = 1.4; 0 on padding."""
    gaps = teacher_gaps(
        1.0, [[0.2, -0.4], [1.0, 0.0]], [[1.0, 1.0], [1.0, 0.0]], step_delta=[[0.8, 0.0], [-0.4, 0.0]]
    )
    shaped = get_credit("opid").fn(gaps, SimpleNamespace(opid_episode_weight=0.5, opid_step_weight=0.25), 0)
    assert_tensor(shaped, [[1.3, 0.8], [1.4, 0.0]])


@pytest.mark.parametrize(
    "bound,weight",
    [
        (0.9, 0.2),  # the bound does not bind: the temperature alone sets the weights
        (0.1, 0.1),  # the bound binds (the default 0.5 would not)
    ],
)
def test_stepopsd_budgets_the_steps_at_the_configured_temperature_and_bound(bound: float, weight: float) -> None:
    """StepOPSD, A = 2, temperature 2, two one-token steps with gaps +x and -x, x = ln 1.5. One span, n = [1, 1]:
    w = 2 exp(+-x/2) / (exp(x/2) + exp(-x/2)) = 1 +- tanh(x/2) = 1 +- 0.2 (tanh(ln(1.5)/2) = (1.5 - 1)/(1.5 + 1)),
    clipped to 1 +- bound and already summing to 2. A_t = 2 (1 +- min(0.2, bound)). At the default temperature 1,
    tanh(ln 1.5) = 1.25/3.25 would give other weights."""
    x = math.log(1.5)
    gaps = teacher_gaps(2.0, [[x, 0.0], [-x, 0.0]], [[1.0, 0.0], [1.0, 0.0]])
    shaped = get_credit("stepopsd").fn(gaps, SimpleNamespace(stepopsd_temperature=2.0, stepopsd_bound=bound), 0)
    assert_tensor(shaped, [[2.0 * (1.0 + weight), 0.0], [2.0 * (1.0 - weight), 0.0]])


def test_stepopsd_leaves_a_one_turn_trajectory_at_its_outcome_advantage() -> None:
    """With one step the budget is all that step's: weight 1, so A = -1.5 on each of its scored tokens."""
    gaps = teacher_gaps(-1.5, [[0.7, -0.2, 0.0]], [[1.0, 1.0, 0.0]])
    shaped = get_credit("stepopsd").fn(gaps, SimpleNamespace(stepopsd_temperature=2.0, stepopsd_bound=0.1), 0)
    assert_tensor(shaped, [[-1.5, -1.5, 0.0]])
