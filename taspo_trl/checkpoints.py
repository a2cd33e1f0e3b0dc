"""Checkpoints and final models that can be told complete from cut off, and the run's hold on its ``output_dir``.

A save (``checkpoint-N`` or the final model in ``output_dir``) is bracketed by two small files that transformers'
own layout (``TRAINER_STATE_NAME``, ``OPTIMIZER_NAME``, ...) never uses:

* ``_save_started.json``, written before the first file of the save;
* ``_save_complete.json``, written last, after every process finished writing and every file was flushed to disk
  (``fsync``), atomically (a temporary file renamed into place). It lists each file of the save with its size, and
  the run that wrote it (trainer, method, base model), so a later resume can refuse another run's checkpoint.

A folder is complete when its ``_save_complete.json`` holds and every file it lists has the listed size and its
structure (safetensors header, the zip directory of a ``torch.save`` file, ``trainer_state.json``) reads. A folder
with ``_save_started.json`` and no valid ``_save_complete.json`` was cut off. A folder with neither was written
before these markers existed: it counts as complete when the files a resume loads are whole --
``trainer_state.json`` parses (transformers writes it after the weights, the optimizer, the scheduler and the RNG
state), the model weights are there with the full size their safetensors header promises, and the optimizer and
scheduler files are whole zip archives. (The underscore keeps both markers out of a Hub push, as TRL's trainers
skip ``_*`` files.)

The lock: ``_taspo_run.lock`` in ``output_dir`` is held with ``fcntl.flock`` for the run, with the holder's pid,
host and command written in it. Only the launch's main process (global rank 0, ``RANK`` as set by ``accelerate
launch``/``torchrun``) takes it, so the ranks of one launch never refuse each other, and a second launch on the
same folder is refused by its own rank 0 (its launcher then stops its other ranks). The kernel drops the lock when
the process ends, however it ends (``kill -9`` included), so there are no stale locks to clean up; the file stays
behind and means nothing by itself. On NFS, ``flock`` works between machines on Linux since 2.6.12 (it is mapped
to a POSIX byte-range lock).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

logger = logging.getLogger("taspo_trl")

STARTED = "_save_started.json"
COMPLETE = "_save_complete.json"
LOCK = "_taspo_run.lock"
_MARKERS = (STARTED, COMPLETE, LOCK)
_WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_ZIP_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt")  # transformers' OPTIMIZER_NAME, SCHEDULER_NAME, SCALER_NAME
_TRAINER_STATE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME


class OutputDirInUse(ValueError):
    """Another run holds the lock on ``output_dir``."""


class SaveFailed(OSError):
    """Writing a checkpoint or the final model failed (most often a full disk); the message names the folder."""


# ---- is a save complete? -----------------------------------------------------------------------------------------


def _safetensors_problem(path: Path) -> str | None:
    """Why a ``.safetensors`` file is not whole: its header says how long the file must be."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 + length:
                return f"{path.name} is cut off ({size} bytes, its header alone needs {8 + length})"
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as error:
        return f"{path.name} has no readable safetensors header ({error})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"{path.name} is cut off ({size} of {expected} bytes)"
    return None


def _zip_problem(path: Path) -> str | None:
    """Why a ``torch.save`` file (a zip archive) is not whole: a cut-off one has no zip directory at its end."""
    try:
        with zipfile.ZipFile(path):
            return None
    except (OSError, zipfile.BadZipFile) as error:
        return f"{path.name} is not a whole torch.save archive ({error})"


def _weights_problem(folder: Path) -> str | None:
    """Why ``folder`` has no whole model weights (single file, sharded with an index, adapter, or sharded by
    DeepSpeed/FSDP into sub-folders, which are only checked for presence)."""
    for name in _WEIGHT_INDEXES:
        if (folder / name).is_file():
            try:
                shards = sorted(set(json.loads((folder / name).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
                return f"{name} does not read ({error})"
            for shard in shards:
                if not (folder / shard).is_file():
                    return f"{shard} (listed in {name}) is missing"
                if shard.endswith(".safetensors") and (problem := _safetensors_problem(folder / shard)):
                    return problem
            return None
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return _safetensors_problem(folder / name) if name.endswith(".safetensors") else None
    if any(folder.glob("global_step*")) or any(folder.glob("pytorch_model_fsdp*")):
        return None
    return "it holds no model weights (model.safetensors, adapter_model.safetensors, ...)"


def _structure_problem(folder: Path, checkpoint: bool) -> str | None:
    """Why the files a resume (or a load of the model) reads are not whole."""
    if checkpoint:
        try:
            int(json.loads((folder / _TRAINER_STATE).read_text())["global_step"])
        except FileNotFoundError:
            return f"{_TRAINER_STATE} is missing"
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"{_TRAINER_STATE} does not read ({type(error).__name__}: {error})"
    if problem := _weights_problem(folder):
        return problem
    for path in [*(folder / name for name in _ZIP_FILES), *folder.glob("rng_state*.pth")]:
        if path.is_file() and (problem := _zip_problem(path)):
            return problem
    return None


def save_problem(folder: str | Path, checkpoint: bool = True) -> str | None:
    """Why the save in ``folder`` (a ``checkpoint-N``, or with ``checkpoint=False`` the final model in
    ``output_dir``) is not complete, or None when it is. See the module's docstring for the rules."""
    folder = Path(folder)
    marker = folder / COMPLETE
    if marker.is_file():
        try:
            files = json.loads(marker.read_text())["files"]
            assert isinstance(files, dict)
        except (OSError, ValueError, KeyError, AssertionError) as error:
            return f"its {COMPLETE} does not read ({error})"
        for name, size in files.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing (listed in {COMPLETE})"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {size} were written"
        return _structure_problem(folder, checkpoint)
    if (folder / STARTED).is_file():
        return f"its save was cut off ({STARTED} without {COMPLETE})"
    return _structure_problem(folder, checkpoint)


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` folder, None for anything else."""
    prefix, _, number = path.name.partition("-")
    return int(number) if prefix == PREFIX_CHECKPOINT_DIR and number.isdigit() and path.is_dir() else None


def checkpoints_newest_first(output_dir: str | Path) -> list[Path]:
    folder = Path(output_dir)
    found = [(step, p) for p in folder.iterdir() if (step := checkpoint_step(p)) is not None] if folder.is_dir() else []
    return [p for _, p in sorted(found, reverse=True)]


def find_resumable(output_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete ``checkpoint-N`` of ``output_dir``, and each newer one skipped with the reason."""
    skipped = []
    for folder in checkpoints_newest_first(output_dir):
        problem = save_problem(folder)
        if problem is None:
            return folder, skipped
        skipped.append((folder, problem))
    return None, skipped


def read_marker(folder: str | Path) -> dict | None:
    try:
        return json.loads((Path(folder) / COMPLETE).read_text())
    except (OSError, ValueError):
        return None


# ---- writing a save: start, then the complete marker last -------------------------------------------------------


def _write_json_atomically(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the files themselves were synced
    finally:
        os.close(descriptor)


def begin_save(folder: str | Path) -> dict[str, tuple[int, int]]:
    """Mark ``folder`` as being written (dropping a complete marker of an earlier save there first) and return what
    its top-level files were before, for ``end_save``'s list of the files this save wrote."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COMPLETE).unlink(missing_ok=True)
    _write_json_atomically(folder / STARTED, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()}


def end_save(folder: str | Path, identity: dict[str, Any], before: dict[str, tuple[int, int]] | None = None) -> None:
    """Flush every file of the save in ``folder`` to disk and write ``_save_complete.json`` last. ``before``
    (``begin_save``'s answer) limits the list to files this save wrote or changed (the final model shares
    ``output_dir`` with the run's logs); without it, every file under ``folder`` is listed."""
    folder = Path(folder)
    files = {}
    for path in sorted(folder.rglob("*") if before is None else folder.iterdir()):
        if not path.is_file() or path.name in _MARKERS or path.name.startswith("."):
            continue
        stat = path.stat()
        if before is not None and before.get(path.name) == (stat.st_size, stat.st_mtime_ns):
            continue  # there before the save and untouched by it (turns.jsonl, a user's log, ...)
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
        files[str(path.relative_to(folder))] = stat.st_size
    _fsync_folder(folder)
    _write_json_atomically(folder / COMPLETE, {"files": files, **identity, "written": time.time()})
    (folder / STARTED).unlink(missing_ok=True)


def run_identity(trainer: Any) -> dict[str, Any]:
    """What a checkpoint must agree on with the run that resumes it: the trainer and method, and the base model."""
    model = getattr(trainer, "model", None)
    config = getattr(model, "config", None)
    method = getattr(trainer.args, "baseline", None)
    shape = {key: getattr(config, key, None) for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}
    return {
        "trainer": type(trainer).__name__ + (f" ({method})" if method else ""),
        "base_model": getattr(config, "_name_or_path", None),
        "model_shape": shape,
        "peft": bool(getattr(model, "peft_config", None)),
    }


def identity_problems(checkpoint: Path, identity: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(refusals, warnings): how ``checkpoint`` (its marker, or for an older one its ``config.json``) differs from
    the run ``identity`` that would resume it. Another trainer or method, another model shape, or LoRA against
    full weights is refused; another base model name (a moved or re-downloaded model) is a warning."""
    marker = read_marker(checkpoint)
    refusals, warnings = [], []
    if marker is None:
        try:
            saved = json.loads((checkpoint / "config.json").read_text())
        except (OSError, ValueError):
            return refusals, warnings
        marker = {"model_shape": {key: saved.get(key) for key in identity["model_shape"]}}
    for key, what in (("trainer", "trainer"), ("peft", "LoRA (peft)")):
        if key in marker and marker[key] != identity[key]:
            refusals.append(f"{what} {marker[key]} there, {identity[key]} in this run")
    shape = {k: v for k, v in (marker.get("model_shape") or {}).items() if v is not None}
    differ = {k: (v, identity["model_shape"].get(k)) for k, v in shape.items() if v != identity["model_shape"].get(k)}
    if differ and not (marker.get("peft") and "vocab_size" in differ and len(differ) == 1):
        refusals.append("model " + ", ".join(f"{k} {a} there, {b} in this run" for k, (a, b) in differ.items()))
    if marker.get("base_model") and identity["base_model"] and marker["base_model"] != identity["base_model"]:
        warnings.append(f"{checkpoint.name} was trained from {marker['base_model']}, this run loads "
                        f"{identity['base_model']}; resuming from it as the same model")
    return refusals, warnings


# ---- the output folder: lock, writable, free space -------------------------------------------------------------


_HELD: dict[str, Any] = {}  # realpath of output_dir -> the open lock file this process holds


def is_main_launch_process() -> bool:
    """The launch's main process: global rank 0 (``RANK`` unset means a single process)."""
    return int(os.environ.get("RANK", "0")) == 0


def hold_output_dir(output_dir: str | Path) -> bool:
    """Create ``output_dir`` if needed, check it is writable, and take the run's lock on it (main process only;
    again in a process that holds it already is a no-op). True when this call took the lock.

    Raises:
        OutputDirInUse: another run holds it; names its pid, host and command.
        ValueError: the folder cannot be created or written, naming it and the fix.
    """
    import fcntl

    folder = Path(output_dir)
    check_writable(folder)
    if not is_main_launch_process():
        return False
    key = os.path.realpath(folder)
    if key in _HELD:
        return False
    handle = open(folder / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise ValueError(f"output_dir {folder}: could not lock {LOCK} ({error})") from None
        raise OutputDirInUse(f"output_dir {folder} is in use by another run ({_describe_holder(holder)}); wait for it "
                             "to finish or stop it, or pick another --output_dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                             "command": " ".join(sys.argv)}) + "\n")
    handle.flush()
    _HELD[key] = handle
    return True


def release_output_dir(output_dir: str | Path) -> None:
    handle = _HELD.pop(os.path.realpath(output_dir), None)
    if handle is not None:
        handle.close()  # closing drops the flock


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"process {holder['pid']} on host {holder['host']}, started {holder['started']}: {holder['command']}"
    except (ValueError, KeyError, TypeError):
        return f"its lock file {LOCK} says {text!r}" if text else f"lock file {LOCK}"


def check_writable(folder: Path) -> None:
    """Create ``folder`` and write, flush and remove a small file in it, so that a read-only or full folder is
    found before training rather than at the first save."""
    probe = folder / f".write_check.{socket.gethostname()}.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with probe.open("wb") as handle:
            handle.write(b"taspo-trl write check\n")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        probe.unlink(missing_ok=True) if probe.parent.is_dir() else None
        fix = "free space on its disk" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "fix its permissions"
        raise ValueError(f"output_dir {folder} is not writable ({error.strerror or error}): the run could not save "
                         f"a checkpoint or its model; {fix}, or pick another --output_dir") from None


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1024 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TB"


def expected_save_bytes(trainer: Any) -> tuple[int, str]:
    """About how many bytes one save of this run writes, and what they are: the weights as saved (only the
    adapter with LoRA) and, for a checkpoint, AdamW's two moments per trained parameter."""
    model = trainer.model
    params = list(model.parameters())
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    weights = trained if getattr(model, "peft_config", None) else sum(p.numel() * p.element_size() for p in params)
    saves_checkpoints = str(getattr(trainer.args.save_strategy, "value", trainer.args.save_strategy)) != "no"
    if not saves_checkpoints or trainer.args.save_only_model:
        return weights, f"model weights {_size(weights)}"
    optimizer = 2 * trained
    return weights + optimizer, f"weights {_size(weights)} + optimizer state {_size(optimizer)}"


def check_free_space(trainer: Any) -> None:
    """Refuse to start when ``output_dir``'s disk has less free space than one save of this run needs."""
    folder = Path(trainer.args.output_dir)
    needed, parts = expected_save_bytes(trainer)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ValueError(
            f"output_dir {folder} has {_size(free)} free on its disk, and one save of this run takes about "
            f"{_size(needed)} ({parts}): free space there, or pick an --output_dir on a bigger disk"
        )


def is_write_failure(error: BaseException) -> bool:
    """A failed write, as Python (``OSError``), ``torch.save``'s writer (a ``RuntimeError`` from
    ``inline_container.cc``) and safetensors (``SafetensorError``: "I/O error: No space left on device") say it."""
    text = str(error)
    return isinstance(error, OSError) or any(sign in text for sign in ("inline_container", "I/O error", "os error",
                                                                       "No space left", "write"))


def save_failed(error: BaseException, folder: Path, what: str) -> SaveFailed:
    """The error to raise when writing ``what`` into ``folder`` failed: it names the folder, the disk's free space
    and, for a full disk, the fix."""
    try:
        free = _size(shutil.disk_usage(folder if folder.exists() else folder.parent).free)
    except OSError:
        free = "unknown"
    code = getattr(error, "errno", None)
    text = " ".join(str(error).split()) or type(error).__name__
    full = code in (errno.ENOSPC, errno.EDQUOT) or any(sign in text for sign in ("No space left", "os error 28",
                                                                                "StorageFull", "Disk quota"))
    cause = "the disk is full" if full else "a write failed"
    message = (f"could not save {what} in {folder}: {cause} ({text}; {free} free there). Free space (or move "
               f"output_dir to a bigger disk) and rerun the same command with --resume_from_checkpoint true: the "
               f"cut-off save is skipped and the run goes on from the newest complete checkpoint")
    failure = SaveFailed(message)  # one argument: str() is the message alone, without an "[Errno N]" prefix
    failure.errno = errno.ENOSPC if full else (code or errno.EIO)
    return failure


# ---- resuming ----------------------------------------------------------------------------------------------------


_REPORTED: set[tuple[str, str]] = set()  # skipped checkpoints already reported by this process


def resume_checkpoint(output_dir: str, resume_from_checkpoint: str | bool | None) -> Path | None:
    """The checkpoint folder a resume loads: for ``True``, the newest *complete* ``checkpoint-N`` of ``output_dir``
    (``save_problem`` tells complete from cut off); each newer one it skips is reported once, with
    the reason, and left where it is (the resumed run writes over it when it reaches that step). None when there
    is nothing to resume."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is not True:
        return Path(resume_from_checkpoint)
    checkpoint, skipped = find_resumable(output_dir)
    for folder, problem in skipped:
        if (str(folder), problem) not in _REPORTED:
            _REPORTED.add((str(folder), problem))
            goes_on = f"resuming from {checkpoint.name}" if checkpoint else "no complete checkpoint: training from step 0"
            logger.warning(f"skipping {folder}: incomplete ({problem}); {goes_on}. It is left in place, and the run "
                           f"saves over it when it reaches step {folder.name.split('-')[1]}")
    return checkpoint


def check_resume_target(output_dir: str, resume_from_checkpoint: str | bool | None) -> None:
    """Refuse a resume with nothing to resume from before any work: transformers finds out only in ``train()``,
    after the games and the model are loaded. ``True`` over a folder whose checkpoints are all cut off trains from
    step 0 (with a warning naming them): that is where the run stands.

    Raises:
        ValueError: ``True`` with no ``checkpoint-N`` in ``output_dir``; a checkpoint path that is not a folder, or
            whose save is incomplete (naming why, and the newest complete one to resume instead).
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return
    if resume_from_checkpoint is True:
        if not checkpoints_newest_first(output_dir):
            raise ValueError(
                f"resume_from_checkpoint true, but output_dir {output_dir} holds no checkpoint-N folder to resume "
                "from; drop --resume_from_checkpoint to start the run, or point --output_dir at the run to resume"
            )
        return
    folder = Path(resume_from_checkpoint)
    if not folder.is_dir():
        raise ValueError(f"resume_from_checkpoint {resume_from_checkpoint}: no such checkpoint folder")
    problem = save_problem(folder)
    if problem is not None:
        newest, _ = find_resumable(folder.parent)
        instead = f"resume from {newest}" if newest else "start the run again without --resume_from_checkpoint"
        raise ValueError(f"resume_from_checkpoint {resume_from_checkpoint} is incomplete ({problem}); {instead}, "
                         "or --resume_from_checkpoint true for the newest complete checkpoint")


def finished_run_message(args: Any, resume_from_checkpoint: str | bool | None) -> str | None:
    """Why resuming from ``resume_from_checkpoint`` has nothing left to train, or None when it has.

    transformers' loop resumed at ``global_step == max_steps`` still trains one step (and saves ``checkpoint-N+1``)
    before it checks the budget, so a finished job re-queued by a scheduler would grow by a step every time. An
    epoch-based run (``max_steps <= 0``) is finished when the checkpoint reached its own ``max_steps`` and
    ``num_train_epochs`` has not been raised since."""
    checkpoint = resume_checkpoint(args.output_dir, resume_from_checkpoint)
    if checkpoint is None:
        return None
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        step = int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not a trainer checkpoint: transformers' own resume says what is wrong
    if args.max_steps > 0:
        if step < args.max_steps:
            return None
        budget = f"max_steps {args.max_steps}"
    else:
        if step < int(state.get("max_steps") or 0) or float(args.num_train_epochs) > float(state.get("num_train_epochs") or 0):
            return None
        budget = f"num_train_epochs {args.num_train_epochs:g}"
    return (
        f"{checkpoint.name} in {checkpoint.parent} is at step {step}, which already meets {budget}: the run is "
        "already finished, nothing to train (raise max_steps or num_train_epochs to train further)"
    )


# ---- the trainer side ---------------------------------------------------------------------------------------------


class CheckpointSaving:
    """Mixed in before a transformers ``Trainer`` subclass (``AgentGRPOTrainer``; ``with_checkpoint_saving`` for
    others): brackets every checkpoint with the markers, keeps ``save_total_limit`` over complete checkpoints only,
    resumes ``resume_from_checkpoint=True`` from the newest complete checkpoint (transformers' own choice is the
    highest number, complete or not), and before training holds the lock on ``output_dir`` and checks that it is
    writable and has room for a checkpoint. A resume at or past the budget loads the checkpoint and trains
    nothing (see ``finished_run_message``)."""

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        from transformers.trainer_callback import TrainerState

        checkpoint, took_lock = self.check_run_start(resume_from_checkpoint)
        try:
            finished = finished_run_message(self.args, checkpoint)
            if finished is None:
                return super().train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint), **kwargs)
            # transformers' loop resumed at the budget would still train a step; load the checkpoint, train none
            logger.warning(finished)
            self.state = TrainerState.load_from_json(str(checkpoint / _TRAINER_STATE))
            if not (self.is_deepspeed_enabled or self.is_fsdp_enabled):  # those load weights in the training loop
                self._load_from_checkpoint(str(checkpoint))
            return TrainOutput(self.state.global_step, float("nan"), {})
        finally:
            if took_lock:
                release_output_dir(self.args.output_dir)

    def check_run_start(self, resume_from_checkpoint: str | bool | None) -> tuple[Path | None, bool]:
        """Before any rollout: the lock on ``output_dir`` (taken here unless this process holds it), a writable
        folder with room for a checkpoint, and the checkpoint to resume, refused if another run wrote it.
        Returns the checkpoint (None: train from the start) and whether the lock was taken here."""
        took_lock = hold_output_dir(self.args.output_dir)
        try:
            if self.args.should_save:
                check_free_space(self)
            check_resume_target(self.args.output_dir, resume_from_checkpoint)
            checkpoint = resume_checkpoint(self.args.output_dir, resume_from_checkpoint)
            if checkpoint is not None:
                refusals, warnings = identity_problems(checkpoint, run_identity(self))
                if refusals:
                    raise ValueError(
                        f"{checkpoint} was written by another run ({'; '.join(refusals)}): resuming would mix the "
                        "two; resume with the method and model that wrote it, or pick another --output_dir"
                    )
                for warning in warnings:
                    logger.warning(warning)
        except BaseException:
            if took_lock:
                release_output_dir(self.args.output_dir)
            raise
        return checkpoint, took_lock

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotate after the marker, below
        try:
            if self.args.should_save:
                begin_save(folder)
            super()._save_checkpoint(model, trial)
            self.accelerator.wait_for_everyone()  # every rank's files (rng_state_N.pth, shards) are written
            if self.args.should_save:
                end_save(folder, {"step": self.state.global_step, **run_identity(self)})
        except Exception as error:
            if not is_write_failure(error):
                raise
            raise save_failed(error, folder, folder.name) from error
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save:
            rotate_complete_checkpoints(folder.parent, limit, self.state.best_model_checkpoint, keep=folder)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        try:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        except Exception as error:  # torch.load's errors name no file: OSError, RuntimeError, UnpicklingError, ...
            raise _unreadable(resume_from_checkpoint, "model weights", error) from error

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        try:
            super()._load_optimizer_and_scheduler(checkpoint)
        except Exception as error:
            raise _unreadable(checkpoint, "optimizer.pt and scheduler.pt", error) from error


def _unreadable(checkpoint: str | None, what: str, error: BaseException) -> RuntimeError:
    text = " ".join(str(error).split())[:300]
    return RuntimeError(
        f"could not load the {what} of {checkpoint} ({type(error).__name__}: {text}): that checkpoint is damaged; "
        f"move it aside and rerun with --resume_from_checkpoint true (the newest complete checkpoint left), or "
        f"name an earlier one with --resume_from_checkpoint {Path(str(checkpoint)).parent}/checkpoint-N"
    )


def rotate_complete_checkpoints(output_dir: Path, limit: int | None, best: str | None, keep: Path) -> None:
    """``save_total_limit`` counted over complete checkpoints (transformers' rotation counts cut-off ones too, and
    can delete the last complete checkpoint for them). The just-written and the best checkpoint stay. A cut-off
    checkpoint older than ``keep`` is removed with a warning: ``keep`` supersedes it."""
    protected = {keep.resolve(), *([Path(best).resolve()] if best else [])}
    complete = []
    for folder in checkpoints_newest_first(output_dir):
        problem = save_problem(folder)
        if problem is None:
            complete.append(folder)
        elif checkpoint_step(folder) < checkpoint_step(keep) and (folder / STARTED).is_file():
            logger.warning(f"removing {folder}: its save was cut off ({problem}) and {keep.name} supersedes it")
            shutil.rmtree(folder, ignore_errors=True)
    if not limit or limit <= 0:
        return
    kept = {folder.resolve() for folder in complete} & protected
    for folder in complete:  # newest first: keep the newest up to the limit, as transformers does
        if folder.resolve() in kept:
            continue
        if len(kept) < max(limit, len(protected)):
            kept.add(folder.resolve())
            continue
        shutil.rmtree(folder, ignore_errors=True)


def with_checkpoint_saving(trainer_class: type) -> type:
    """``trainer_class`` with ``CheckpointSaving`` mixed in (for trainers whose module must stay untouched, such as
    the SFT trainer whose code is part of the warm start's fingerprint)."""
    if issubclass(trainer_class, CheckpointSaving):
        return trainer_class
    return type(trainer_class.__name__, (CheckpointSaving, trainer_class),
                {"__module__": trainer_class.__module__, "__doc__": trainer_class.__doc__})


# ---- the final model ---------------------------------------------------------------------------------------------


def final_model_problem(output_dir: str | Path) -> str | None:
    """Why the final model in ``output_dir`` is not complete (None: it is)."""
    return save_problem(output_dir, checkpoint=False)


def save_final_model(trainer: Any, write: Any) -> None:
    """Run ``write()`` (``save_model``, ``save_state``, the model card) between the markers in ``output_dir``,
    naming the folder if the disk fills up."""
    folder = Path(trainer.args.output_dir)
    before = begin_save(folder) if trainer.args.should_save else None
    try:
        write()
        trainer.accelerator.wait_for_everyone()
        if trainer.args.should_save:
            end_save(folder, {"step": trainer.state.global_step, **run_identity(trainer)}, before=before)
    except Exception as error:
        if not is_write_failure(error):
            raise
        raise save_failed(error, folder, "the final model") from error
