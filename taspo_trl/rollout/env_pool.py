"""Runs a batch of environment episodes, in this process or spread over worker processes.

Text games are CPU-bound Python, so with ``num_workers > 0`` each worker process owns a share of the
batch's episodes and all of them step concurrently. A failing environment never takes the batch down:
its episode ends with an error observation, reward 0 and ``info["error"]`` set. That includes a worker that
dies, or that does not answer within ``step_timeout`` seconds: it is killed and replaced by a fresh one, and
every episode it held ends with an error.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from ..envs.base import AgentEnv, EnvFactory, StepResult

logger = logging.getLogger(__name__)

_START_TIMEOUT = 300.0  # seconds for a fresh worker to spawn and import its environment's modules


@dataclass
class EpisodeStart:
    observation: str
    task: str
    admissible: list[str] | None
    action_tag: str
    max_turns: int
    env_name: str
    task_type: str | None
    error: str | None = None
    action_tags: tuple[str, ...] = ()
    instructions: str = ""


def _start(env: AgentEnv) -> EpisodeStart:
    observation = env.reset()
    return EpisodeStart(
        observation=observation,
        task=env.task,
        admissible=env.admissible_commands,
        action_tag=getattr(env, "action_tag", "action"),
        max_turns=int(getattr(env, "max_turns", 50)),
        env_name=getattr(env, "env_name", type(env).__name__),
        task_type=getattr(env, "task_type", None),
        action_tags=tuple(getattr(env, "action_tags", ())) or (getattr(env, "action_tag", "action"),),
        instructions=str(getattr(env, "instructions", "") or ""),
    )


def _failed_start(spec: dict[str, Any], error: str) -> EpisodeStart:
    return EpisodeStart(f"[environment error] {error}", str(spec.get("prompt", "")), None, "action", 0, "", None, error)


def _failed_step(_action: str, error: str) -> StepResult:
    return StepResult(f"[environment error] {error}", 0.0, True, {"won": False, "error": error})


def _safe_step(env: AgentEnv, action: str) -> StepResult:
    try:
        result = env.step(action)
        return result if isinstance(result, StepResult) else StepResult(*result)
    except Exception as exc:  # an environment bug must end one episode, not the training run
        logger.warning("environment step failed: %s", exc)
        return StepResult(f"[environment error] {exc}", 0.0, True, {"won": False, "error": repr(exc)})


def _safe_close(env: AgentEnv | None) -> None:
    if env is not None and hasattr(env, "close"):
        try:
            env.close()
        except Exception:  # closing is best effort
            pass


class _LocalEpisodes:
    def __init__(self, factory: EnvFactory):
        self.factory = factory
        self.envs: dict[int, AgentEnv] = {}

    def start(self, items: list[tuple[int, dict[str, Any]]]) -> list[EpisodeStart]:
        out = []
        for key, spec in items:
            try:
                env = self.factory(spec)
                self.envs[key] = env
                out.append(_start(env))
            except Exception as exc:
                logger.warning("environment reset failed for %s: %s", spec, exc)
                out.append(_failed_start(spec, repr(exc)))
        return out

    def step(self, items: list[tuple[int, str]]) -> list[StepResult]:
        out: list[StepResult | None] = [None] * len(items)
        batched: dict[type, list[int]] = {}
        for i, (key, action) in enumerate(items):
            env = self.envs.get(key)
            if env is None:
                out[i] = _failed_step(action, "episode was never started")
            elif hasattr(type(env), "step_many"):
                batched.setdefault(type(env), []).append(i)
            else:
                out[i] = _safe_step(env, action)
        for env_class, indices in batched.items():
            envs = [self.envs[items[i][0]] for i in indices]
            actions = [items[i][1] for i in indices]
            try:
                results = list(env_class.step_many(envs, actions))
                if len(results) != len(indices):
                    raise RuntimeError(f"step_many returned {len(results)} results for {len(indices)} actions")
            except Exception as exc:  # a batching bug falls back to one step at a time rather than ending the run
                logger.warning("%s.step_many failed (%s); stepping one by one", env_class.__name__, exc)
                results = [_safe_step(env, action) for env, action in zip(envs, actions, strict=True)]
            for i, result in zip(indices, results, strict=True):
                out[i] = result if isinstance(result, StepResult) else StepResult(*result)
        return out  # type: ignore[return-value]

    def close(self, items: list[tuple[int, Any]]) -> list[None]:
        for key, _ in items:
            _safe_close(self.envs.pop(key, None))
        return [None] * len(items)


class _WorkerLost(RuntimeError):
    """The worker died or stayed silent past the deadline: it must be replaced."""


@dataclass
class _ItemError:
    """Stands in for one result the worker could not send back (e.g. an ``info`` holding a lock)."""

    error: str


def _picklable(results: list[Any]) -> list[Any]:
    out = []
    for result in results:
        try:
            pickle.dumps(result)
            out.append(result)
        except Exception as exc:  # pickling raises TypeError, AttributeError, PicklingError, ...
            out.append(_ItemError(f"result could not be sent from the worker: {exc!r}"))
    return out


def _worker(conn: Any, factory: EnvFactory) -> None:
    episodes = _LocalEpisodes(factory)
    conn.send("ready")  # imports are done: from here on, the pool's per-call deadline is fair
    while True:
        try:
            command, payload = conn.recv()
        except EOFError:
            break
        if command == "stop":
            episodes.close([(key, None) for key in episodes.envs])
            break
        try:
            result = getattr(episodes, command)(payload)
        except Exception:
            result = RuntimeError(traceback.format_exc())
        try:
            conn.send(result)
        except Exception:  # an unpicklable result fails its own episode; the worker and its other episodes live on
            conn.send(_picklable(result) if isinstance(result, list) else RuntimeError(traceback.format_exc()))


class EnvPool:
    """Starts, steps and closes episodes keyed by an integer id.

    Args:
        factory: builds one episode from a task spec; must be picklable (a module-level function) when
            ``num_workers > 0``.
        num_workers: 0 runs every environment in this process; N > 0 spreads episodes over N processes.
        step_timeout: seconds a worker may take to answer one call (reset, step or close of all its episodes
            in that call). A worker past it, or one that died, is killed and replaced, and every episode it held
            ends with an environment error. In process (``num_workers=0``) there is no hard timeout: a Python
            call cannot be interrupted safely, so use workers for environments that can hang.
    """

    def __init__(self, factory: EnvFactory, num_workers: int = 0, step_timeout: float = 300.0):
        if step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout}.")
        self.factory = factory
        self.num_workers = num_workers
        self.step_timeout = step_timeout
        self._local = _LocalEpisodes(factory) if num_workers == 0 else None
        self._workers: list[tuple[Any, Any]] = []
        self._owner: dict[int, int] = {}
        self._lost: dict[int, str] = {}  # episodes whose worker was replaced, with the reason
        self.replacements = 0
        self._context = mp.get_context("spawn")
        self._workers = [self._spawn() for _ in range(num_workers)]
        for w in range(num_workers):
            self._await_ready(w)

    def _spawn(self) -> tuple[Any, Any]:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker, args=(child, self.factory), daemon=True)
        process.start()
        child.close()  # so that the worker's death reads as EOF here instead of a recv that waits forever
        return parent, process

    def _await_ready(self, w: int) -> None:
        """Waits out a worker's start-up (spawning and imports), which the per-call deadline does not cover."""
        conn, process = self._workers[w]
        answered = wait([conn], timeout=_START_TIMEOUT)
        reply = self._receive(w) if answered else None
        if reply == "ready":
            return
        if isinstance(reply, _WorkerLost):  # it died: the commonest cause is a script without a __main__ guard
            process.join(timeout=5)
            raise RuntimeError(
                f"environment worker {w} exited during start-up (exit code {process.exitcode}) before it was ready. "
                "Workers are spawned processes that import the main script: a script that trains with env_workers > "
                "0 must run its training under `if __name__ == \"__main__\":`, and the environment factory must be a "
                "module-level function whose module imports cleanly in a fresh process (the worker's error is "
                "printed above)."
            )
        process.kill()
        raise RuntimeError(
            f"environment worker {w} did not start within {_START_TIMEOUT} s: check that the environment factory "
            "is a module-level function whose module imports cleanly in a fresh process."
        )

    def start(self, specs: dict[int, dict[str, Any]]) -> dict[int, EpisodeStart]:
        if self._local is not None:
            return dict(zip(specs, self._local.start(list(specs.items())), strict=True))
        for n, key in enumerate(specs):
            self._owner[key] = n % self.num_workers
            self._lost.pop(key, None)
        return self._scatter("start", specs, _failed_start)

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        if self._local is not None:
            return dict(zip(actions, self._local.step(list(actions.items())), strict=True))
        return self._scatter("step", actions, _failed_step)

    def close(self, keys: list[int]) -> None:
        if self._local is not None:
            self._local.close([(key, None) for key in keys])
            return
        self._scatter("close", {key: None for key in keys}, lambda _value, _error: None)
        for key in keys:
            self._owner.pop(key, None)
            self._lost.pop(key, None)

    def shutdown(self) -> None:
        for conn, process in getattr(self, "_workers", []):  # also after a constructor that raised
            try:
                conn.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
            conn.close()
        self._workers = []

    def _scatter(self, command: str, payload: dict[int, Any], on_failure: Any) -> dict[int, Any]:
        out: dict[int, Any] = {}
        by_worker: dict[int, list[tuple[int, Any]]] = {}
        for key, value in payload.items():
            if key in self._lost:
                out[key] = on_failure(value, self._lost[key])
            else:
                by_worker.setdefault(self._owner[key], []).append((key, value))
        results: dict[int, Any] = {}
        for w, items in by_worker.items():
            try:
                self._workers[w][0].send((command, items))
            except (BrokenPipeError, OSError) as exc:
                results[w] = _WorkerLost(f"environment worker {w} is gone: {exc!r}")
        results.update(self._gather([w for w in by_worker if w not in results], command))
        self._replace({w: str(r) for w, r in results.items() if isinstance(r, _WorkerLost)})
        for w, items in by_worker.items():
            result = results[w]
            if isinstance(result, Exception):
                logger.error("environment worker %d failed: %s", w, result)
                result = [on_failure(value, str(result)) for _, value in items]
            for (key, value), r in zip(items, result, strict=True):
                out[key] = on_failure(value, r.error) if isinstance(r, _ItemError) else r
        return {key: out[key] for key in payload}

    def _gather(self, workers: list[int], command: str) -> dict[int, Any]:
        """Each worker's answer, or an error for one that died or stayed silent past the deadline."""
        deadline = time.monotonic() + self.step_timeout
        waiting = {self._workers[w][0]: w for w in workers}
        results: dict[int, Any] = {}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for conn in wait(list(waiting), timeout=remaining):
                w = waiting.pop(conn)
                results[w] = self._receive(w)
        for w in waiting.values():
            results[w] = _WorkerLost(f"environment worker {w} did not answer {command!r} within {self.step_timeout} s")
        return results

    def _receive(self, w: int) -> Any:
        conn, process = self._workers[w]
        try:
            return conn.recv()
        except (EOFError, OSError) as exc:
            return _WorkerLost(f"environment worker process {process.pid} died: {exc!r}")

    def _replace(self, reasons: dict[int, str]) -> None:
        """Kills the given workers and starts fresh ones, all at once: start-up is seconds of imports each."""
        for w, reason in reasons.items():
            conn, process = self._workers[w]
            process.kill()
            process.join(timeout=5)
            conn.close()
            for key, owner in self._owner.items():
                if owner == w:
                    self._lost[key] = f"environment worker was replaced: {reason}"
            self._workers[w] = self._spawn()
        for w in reasons:
            self._await_ready(w)
            self.replacements += 1
            logger.error("environment worker %d replaced; its episodes end with an error", w)

    def __del__(self) -> None:
        self.shutdown()
