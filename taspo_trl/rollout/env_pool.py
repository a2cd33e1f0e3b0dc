"""Runs a batch of environment episodes, in this process or spread over worker processes.

Text games are CPU-bound Python, so with ``num_workers > 0`` each worker process owns a share of the
batch's episodes and all of them step concurrently. A failing environment never takes the batch down:
its episode ends with an error observation, reward 0 and ``info["error"]`` set. That includes a worker that
dies, or that does not answer within ``step_timeout`` seconds: it is killed and replaced by a fresh one, and
every episode it held ends with an error. In process (``num_workers=0``) every environment call runs on one helper
thread that the pool waits on for at most ``step_timeout`` seconds: a call past it ends its episode (the thread
is left to finish or hang on its own, and a fresh one takes the next calls). An environment that raises
``SystemExit`` fails its episode; one that calls ``os._exit`` ends the process (nothing can stop that), with a
line naming the environment and the fix, unless it runs in a worker, which is replaced.

What an environment returns is checked where it arrives: ``reset()`` must give the observation text and
``step()`` a ``StepResult`` (or ``(observation, reward, done, info)``) with a numeric reward; anything else fails
the episode with a message naming the environment. Text that is not valid Unicode (lone surrogates) is replaced
by U+FFFD and counted in ``EnvPool.replaced_characters``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from ..envs.base import AgentEnv, EnvFactory, StepResult
from .chat import replace_invalid_unicode

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


def _env_label(env: Any) -> str:
    name = getattr(env, "env_name", None)
    kind = type(env).__name__
    return f"environment {kind}" if not name or name == kind else f"environment {kind} ({name})"


def _start(env: AgentEnv) -> EpisodeStart:
    observation = env.reset()
    if not isinstance(observation, str):
        raise TypeError(
            f"{_env_label(env)}: reset() returned {type(observation).__name__} where the first observation's text "
            "(a str) is expected; make reset() return the text the agent sees first."
        )
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


def _step_result(env: Any, result: Any) -> StepResult:
    """``result`` as a ``StepResult``, or a ``TypeError`` naming the environment and what it must return."""
    if not isinstance(result, StepResult):
        try:
            result = StepResult(*result)
        except TypeError:
            raise TypeError(
                f"{_env_label(env)}: step() returned {type(result).__name__}; return a StepResult(observation, "
                "reward, done, info) or the tuple (observation, reward, done, info)."
            ) from None
    problem = None
    if not isinstance(result.observation, str):
        problem = f"an observation of type {type(result.observation).__name__} (a str is expected)"
    elif not _is_number(result.reward):
        problem = f"a reward of type {type(result.reward).__name__} (a float is expected)"
    elif result.info is not None and not isinstance(result.info, dict):
        problem = f"an info of type {type(result.info).__name__} (a dict is expected)"
    if problem is not None:
        raise TypeError(f"{_env_label(env)}: step() returned {problem}; return StepResult(str, float, bool, dict).")
    return result


def _is_number(value: Any) -> bool:
    """Whether ``float()`` reads ``value`` (a float, int, bool, numpy scalar or one-element tensor); not text."""
    if isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


_in_environment = threading.local()  # what the calling thread is running, for the os._exit hook
_real_exit = os._exit
_hook_pid: int | None = None


def _exit_from_environment(code: int) -> None:
    """``os._exit`` while an in-process pool is alive: the same exit, with a line first when an environment of
    this process (not a forked child) called it, since it ends the run at once without a traceback."""
    what = getattr(_in_environment, "what", None)
    if what is not None and os.getpid() == _hook_pid:
        try:
            sys.stderr.write(
                f"[taspo-trl] {what} called os._exit({code}), which ends this process at once: training stops here "
                "with nothing saved since the last checkpoint. Run the environment in worker processes (env_workers: "
                "1 or more; EnvPool(num_workers=...)), where an environment that exits fails only its own episodes, "
                "or make it raise an exception instead.\n"
            )
            sys.stderr.flush()
        except Exception:  # the exit must happen whatever stderr is
            pass
    _real_exit(code)


def _install_exit_hook() -> None:
    global _hook_pid
    _hook_pid = os.getpid()
    os._exit = _exit_from_environment


class _EnvironmentThread:
    """Runs in-process environment calls on one helper thread and waits at most ``timeout`` seconds for each.

    One thread for all calls, so an environment that keeps thread-bound state (an SQLite connection, an event
    loop) sees the thread it was built on. A call past its time is left running; the next call gets a new thread.
    """

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._jobs: queue.SimpleQueue | None = None

    def run(self, what: str, fn: Any, *args: Any) -> Any:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), name="taspo-trl environments", daemon=True).start()
        done = threading.Event()
        outcome: dict[str, Any] = {}
        self._jobs.put((what, fn, args, outcome, done))
        if not done.wait(self.timeout):
            self._jobs.put(None)  # the hung thread stops after its call, if it ever returns
            self._jobs = None
            raise TimeoutError(
                f"{what} did not return within {self.timeout} s (env_step_timeout); its episode ends with an error "
                "(the call is left running on its own thread; env_workers > 0 runs environments in processes that "
                "a hung call cannot block)"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            what, fn, args, outcome, done = job
            _in_environment.what = what
            try:
                outcome["value"] = fn(*args)
            except BaseException as error:  # handed to the waiting thread, which decides
                outcome["error"] = error
            finally:
                _in_environment.what = None
                done.set()


class _LocalEpisodes:
    """Episodes of this process. With ``step_timeout`` (an in-process pool) every environment call runs on the
    ``_EnvironmentThread`` with that deadline; without (inside a worker) it runs directly, under the pool's
    deadline for the whole worker."""

    def __init__(self, factory: EnvFactory, step_timeout: float | None = None):
        self.factory = factory
        self.envs: dict[int, AgentEnv] = {}
        self._thread = _EnvironmentThread(step_timeout) if step_timeout is not None else None
        self._hung: dict[int, str] = {}  # episodes whose call timed out: never called again
        if self._thread is not None:
            _install_exit_hook()

    def _run(self, what: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``; ``SystemExit`` from environment code becomes an ordinary error of its episode."""
        try:
            return self._thread.run(what, fn, *args) if self._thread is not None else fn(*args)
        except SystemExit as exc:
            raise RuntimeError(
                f"{what} raised SystemExit({exc.code!r}); an environment must raise an ordinary exception to fail "
                "its episode, never exit"
            ) from None

    def _begin(self, key: int, spec: dict[str, Any]) -> EpisodeStart:
        env = self.factory(spec)
        self.envs[key] = env
        return _start(env)

    def start(self, items: list[tuple[int, dict[str, Any]]]) -> list[EpisodeStart]:
        out = []
        for key, spec in items:
            self._hung.pop(key, None)
            try:
                out.append(self._run("the environment factory or reset()", self._begin, key, spec))
            except Exception as exc:
                logger.warning("environment reset failed for %s: %s", spec, exc)
                if isinstance(exc, TimeoutError):
                    self._hung[key] = str(exc)
                out.append(_failed_start(spec, repr(exc)))
        return out

    def _step_one(self, key: int, env: AgentEnv, action: str) -> StepResult:
        try:
            return _step_result(env, self._run(f"{_env_label(env)} step()", env.step, action))
        except Exception as exc:  # an environment bug must end one episode, not the training run
            logger.warning("environment step failed: %s", exc)
            if isinstance(exc, TimeoutError):
                self._hung[key] = str(exc)
            return StepResult(f"[environment error] {exc}", 0.0, True, {"won": False, "error": repr(exc)})

    def step(self, items: list[tuple[int, str]]) -> list[StepResult]:
        out: list[StepResult | None] = [None] * len(items)
        batched: dict[type, list[int]] = {}
        for i, (key, action) in enumerate(items):
            env = self.envs.get(key)
            if key in self._hung:
                out[i] = _failed_step(action, self._hung[key])
            elif env is None:
                out[i] = _failed_step(action, "episode was never started")
            elif hasattr(type(env), "step_many"):
                batched.setdefault(type(env), []).append(i)
            else:
                out[i] = self._step_one(key, env, action)
        for env_class, indices in batched.items():
            envs = [self.envs[items[i][0]] for i in indices]
            actions = [items[i][1] for i in indices]
            try:
                results = list(self._run(f"environment {env_class.__name__} step_many()", env_class.step_many, envs, actions))
                if len(results) != len(indices):
                    raise RuntimeError(f"step_many returned {len(results)} results for {len(indices)} actions")
                results = [_step_result(env, result) for env, result in zip(envs, results, strict=True)]
            except TimeoutError as exc:  # stepping one by one would wait again for each
                logger.warning("%s", exc)
                for i in indices:
                    self._hung[items[i][0]] = str(exc)
                results = [_failed_step(action, str(exc)) for action in actions]
            except Exception as exc:  # a batching bug falls back to one step at a time rather than ending the run
                logger.warning("%s.step_many failed (%s); stepping one by one", env_class.__name__, exc)
                results = [self._step_one(items[i][0], env, action) for i, env, action in zip(indices, envs, actions, strict=True)]
            for i, result in zip(indices, results, strict=True):
                out[i] = result
        return out  # type: ignore[return-value]

    def close(self, items: list[tuple[int, Any]]) -> list[None]:
        for key, _ in items:
            env = self.envs.pop(key, None)
            if self._hung.pop(key, None) is None and env is not None and hasattr(env, "close"):
                try:
                    self._run(f"{_env_label(env)} close()", env.close)
                except Exception:  # closing is best effort
                    pass
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
            ends with an environment error. In process (``num_workers=0``) each environment call gets this long
            on the pool's helper thread; one past it ends its episode, but a Python call cannot be stopped, so
            the hung call keeps its thread (and whatever it holds): use workers for environments that can hang.
    """

    def __init__(self, factory: EnvFactory, num_workers: int = 0, step_timeout: float = 300.0):
        if step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout}.")
        self.factory = factory
        self.num_workers = num_workers
        self.step_timeout = step_timeout
        self._local = _LocalEpisodes(factory, step_timeout) if num_workers == 0 else None
        self._workers: list[tuple[Any, Any]] = []
        self._owner: dict[int, int] = {}
        self._lost: dict[int, str] = {}  # episodes whose worker was replaced, with the reason
        self.replacements = 0
        self.replaced_characters = 0
        """Lone surrogates replaced by U+FFFD in the text environments sent so far."""
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
            started = dict(zip(specs, self._local.start(list(specs.items())), strict=True))
        else:
            for n, key in enumerate(specs):
                self._owner[key] = n % self.num_workers
                self._lost.pop(key, None)
            started = self._scatter("start", specs, _failed_start)
        for start in started.values():
            start.observation, start.task = self._text(start.observation), self._text(start.task)
            start.instructions = self._text(start.instructions)
            if start.admissible is not None:
                start.admissible = [self._text(command) for command in start.admissible]
        return started

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        if self._local is not None:
            results = dict(zip(actions, self._local.step(list(actions.items())), strict=True))
        else:
            results = self._scatter("step", actions, _failed_step)
        for result in results.values():
            result.observation = self._text(result.observation)
            commands = (result.info or {}).get("admissible_commands")
            if isinstance(commands, list):
                result.info["admissible_commands"] = [self._text(command) for command in commands]
        return results

    def _text(self, text: Any) -> Any:
        """``text`` with lone surrogates replaced by U+FFFD (counted in ``replaced_characters``, warned once)."""
        if not isinstance(text, str):
            return text
        text, replaced = replace_invalid_unicode(text)
        if replaced:
            if not self.replaced_characters:
                logger.warning("an environment sent text with %d invalid Unicode characters (lone surrogates); they "
                               "are replaced by U+FFFD and counted in env/replaced_characters", replaced)
            self.replaced_characters += replaced
        return text

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
