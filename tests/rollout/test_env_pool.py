"""Environment worker faults, with real worker processes: a step or reset that hangs, one that raises, a result
that cannot be pickled, and a worker killed with ``os.kill``. Each ends only the episodes it touches, a lost
worker is replaced, and later episodes succeed on every worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from taspo_trl.rollout.env_pool import EnvPool
from tests.helpers.toy_envs import fault_factory

TIMEOUT = 3.0  # the pool's per-call deadline; generous for a toy step, short for a test
BOUND = 60  # seconds any one test may take before it is failed rather than left hanging


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    def fail(_signum, _frame):
        raise TimeoutError(f"test ran past {BOUND} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(BOUND)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def pool() -> Iterator[EnvPool]:
    """One pool for the module (workers take seconds to spawn); every test leaves it with all episodes closed."""
    pool = EnvPool(fault_factory, num_workers=2, step_timeout=TIMEOUT)
    try:
        yield pool
    finally:
        pool.shutdown()


def _pids(pool: EnvPool) -> list[int]:
    return [process.pid for _, process in pool._workers]


def _healthy_round(pool: EnvPool, first_key: int) -> None:
    """Four fresh episodes (two per worker) start and win: every worker serves again."""
    keys = list(range(first_key, first_key + 4))
    starts = pool.start({k: {} for k in keys})
    assert all(s.error is None for s in starts.values())
    results = pool.step({k: "win" for k in keys})
    assert [(r.reward, r.info.get("error")) for r in results.values()] == [(1.0, None)] * 4
    pool.close(keys)
    assert all(process.is_alive() for _, process in pool._workers)


@pytest.mark.parametrize("fault", ["hang", "die"])
def test_a_lost_worker_ends_its_episodes_and_is_replaced(pool, fault):
    # Keys go round-robin: 0 and 2 on worker 0, 1 and 3 on worker 1. Key 0's step hangs or kills its worker.
    pool.start({0: {"fault": fault}, 1: {}, 2: {}, 3: {}})
    before, replaced = _pids(pool), pool.replacements
    results = pool.step({0: "win", 1: "win", 2: "win", 3: "win"})
    assert [results[k].reward for k in range(4)] == [0.0, 1.0, 0.0, 1.0]
    assert results[0].done and results[0].info["error"] and results[2].info["error"]
    assert results[1].info.get("error") is None and results[3].info.get("error") is None
    after = _pids(pool)
    assert after[0] != before[0] and after[1] == before[1] and pool.replacements == replaced + 1
    pool.close([0, 1, 2, 3])
    _healthy_round(pool, 10)


def test_a_worker_killed_between_calls_is_replaced(pool):
    pool.start({0: {}, 1: {}})
    replaced = pool.replacements
    os.kill(pool._workers[1][1].pid, signal.SIGKILL)
    pool._workers[1][1].join(timeout=BOUND)
    results = pool.step({0: "win", 1: "win"})
    assert results[0].reward == 1.0 and results[0].info.get("error") is None
    assert results[1].reward == 0.0 and "environment worker 1" in results[1].info["error"]
    assert pool.replacements == replaced + 1
    pool.close([0, 1])
    _healthy_round(pool, 10)


def test_a_reset_that_hangs_fails_its_start_and_the_worker_is_replaced(pool):
    replaced = pool.replacements
    starts = pool.start({0: {"fault": "hang", "at": "reset"}, 1: {}})
    assert "did not answer 'start'" in starts[0].error and starts[1].error is None
    assert pool.replacements == replaced + 1
    pool.close([0, 1])
    _healthy_round(pool, 10)


@pytest.mark.parametrize("fault", ["raise", "unpicklable"])
def test_a_failing_step_ends_only_its_episode_and_keeps_the_worker(pool, fault):
    pool.start({0: {"fault": fault}, 1: {}, 2: {}, 3: {}})
    before, replaced = _pids(pool), pool.replacements
    results = pool.step({0: "win", 1: "win", 2: "win", 3: "win"})
    assert results[0].reward == 0.0 and results[0].done and results[0].info["error"]
    # key 2 lives on the same worker as key 0 and is untouched
    assert [results[k].reward for k in (1, 2, 3)] == [1.0, 1.0, 1.0]
    assert _pids(pool) == before and pool.replacements == replaced
    pool.close([0, 1, 2, 3])
    _healthy_round(pool, 10)


def test_a_non_positive_timeout_is_refused():
    with pytest.raises(ValueError, match="step_timeout must be > 0"):
        EnvPool(fault_factory, num_workers=1, step_timeout=0)


def test_training_stops_after_saving_when_episodes_keep_failing(tmp_path, tiny_model_dir):
    from tests.helpers.cpu_config import cpu_trainer_kwargs
    from datasets import Dataset
    from tests.helpers.toy_envs import locker_factory

    from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt

    dataset = Dataset.from_list([{"prompt": encode_task_prompt({"target": 3, "fail_reset": True})}])
    args = AgentGRPOConfig(
        **cpu_trainer_kwargs(tmp_path / "out", max_steps=5, max_env_error_rate=0.5, env_error_patience=2)
    )
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=args, train_dataset=dataset, env_factory=locker_factory)
    try:
        with pytest.raises(RuntimeError, match="env/error_rate was above max_env_error_rate=0.5 for 2 consecutive"):
            trainer.train()
    finally:
        trainer.close()
    # Every episode fails (rate 1.0): the first batch trains step 1, the second trips the guard before step 2.
    assert trainer.state.global_step == 1
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-1"]
    assert (tmp_path / "out" / "checkpoint-1" / "trainer_state.json").is_file()


@pytest.mark.parametrize(
    "field,value,message",
    [("env_step_timeout", 0.0, "env_step_timeout must be > 0"), ("max_env_error_rate", 1.5, "max_env_error_rate must"),
     ("env_error_patience", 0, "env_error_patience must be >= 1")],
)
def test_guard_settings_are_checked(tmp_path, field, value, message):
    from tests.helpers.cpu_config import cpu_trainer_kwargs

    from taspo_trl import AgentGRPOConfig

    with pytest.raises(ValueError, match=message):
        AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path / "out", **{field: value}))
