"""Runs that survive (issue 60, points 1-4 and the checkpoint ones of 10): a save cut off at any moment never stops
a later resume, a cut-off final model is saved again, ``output_dir`` is checked and locked before any work, and
a full disk, a damaged ``optimizer.pt``, another run's checkpoint and a duplicated recipe key each get one message
naming the folder or file and the fix.

The default run checks the rules on folders laid out as an interrupted save leaves them, and the lock and the
output folder with real ``taspo-train`` processes refused before the model loads. ``-m slow`` kills real training
processes (SIGKILL) before, during and after each file of a checkpoint and of the final model, reruns the same
command with ``--resume_from_checkpoint true``, and compares the final model with an uninterrupted run's,
bit for bit (as ``test_train_parity.test_resumed_run_matches_an_uninterrupted_one`` does).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from taspo_trl import checkpoints
from taspo_trl.checkpoints import (
    COMPLETE,
    LOCK,
    STARTED,
    CheckpointSaving,
    begin_save,
    check_resume_target,
    end_save,
    resume_checkpoint,
)

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = {"trainer": "AgentGRPOTrainer", "base_model": "tiny", "peft": False,
            "model_shape": {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 16}}


def _write_checkpoint(folder: Path, step: int, marked: bool = True) -> Path:
    """A checkpoint with transformers' file layout, small tensors, bracketed by the markers when ``marked``."""
    if marked:
        begin_save(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((64,), float(step))}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({k: v for k, v in IDENTITY["model_shape"].items()}))
    torch.save({"state": {0: {"exp_avg": torch.zeros(64)}}}, folder / "optimizer.pt")
    torch.save({"last_epoch": step}, folder / "scheduler.pt")
    torch.save({"cpu": torch.get_rng_state()}, folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    if marked:
        end_save(folder, {"step": step, **IDENTITY})
    return folder


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# --- point 1: resume past a cut-off checkpoint ------------------------------------------------------------------


def test_resume_takes_the_newest_complete_checkpoint_and_names_each_skipped(tmp_path, caplog):
    """checkpoint-3 was cut off in its optimizer.pt, checkpoint-4 right after it started: resume takes
    checkpoint-2, says why it skipped each, and deletes nothing (transformers and the old code took checkpoint-4)."""
    for step in (1, 2, 3):
        _write_checkpoint(tmp_path / f"checkpoint-{step}", step)
    (tmp_path / "checkpoint-3" / COMPLETE).unlink()
    (tmp_path / "checkpoint-3" / STARTED).write_text("{}")
    _cut(tmp_path / "checkpoint-3" / "optimizer.pt")
    begin_save(tmp_path / "checkpoint-4")
    with caplog.at_level(logging.WARNING, logger="taspo_trl"):
        assert resume_checkpoint(str(tmp_path), True) == tmp_path / "checkpoint-2"
    said = caplog.text
    assert "skipping" in said and "checkpoint-4: incomplete" in said and "checkpoint-3: incomplete" in said
    assert "cut off" in said and "resuming from checkpoint-2" in said
    assert all((tmp_path / f"checkpoint-{n}").is_dir() for n in (1, 2, 3, 4))  # nothing deleted
    check_resume_target(str(tmp_path), True)  # and the resume is allowed


@pytest.mark.parametrize("damage", ["optimizer.pt", "model.safetensors", "trainer_state.json", "scheduler.pt",
                                    "rng_state.pth"])
def test_a_file_cut_after_its_marker_was_written_is_found(tmp_path, damage):
    """A complete marker lists each file's size: a file cut later (a copy that stopped, a bad disk) is caught."""
    _write_checkpoint(tmp_path / "checkpoint-1", 1)
    _write_checkpoint(tmp_path / "checkpoint-2", 2)
    _cut(tmp_path / "checkpoint-2" / damage)
    problem = checkpoints.save_problem(tmp_path / "checkpoint-2")
    assert problem and damage in problem
    assert resume_checkpoint(str(tmp_path), True) == tmp_path / "checkpoint-1"


@pytest.mark.parametrize(("damage", "named"), [
    (lambda f: _cut(f / "model.safetensors"), "model.safetensors is cut off"),
    (lambda f: _cut(f / "optimizer.pt"), "optimizer.pt is not a whole torch.save archive"),
    (lambda f: _cut(f / "trainer_state.json"), "trainer_state.json does not read"),
    (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    (lambda f: (f / "model.safetensors").unlink(), "holds no model weights"),
])
def test_checkpoints_written_before_the_markers_are_checked_by_their_files(tmp_path, damage, named):
    """A checkpoint without markers (written before them) counts as complete when the files a resume loads are
    whole: an intact one is taken, a damaged one skipped with the file named."""
    _write_checkpoint(tmp_path / "checkpoint-1", 1, marked=False)
    _write_checkpoint(tmp_path / "checkpoint-2", 2, marked=False)
    assert checkpoints.save_problem(tmp_path / "checkpoint-2") is None
    damage(tmp_path / "checkpoint-2")
    assert named in checkpoints.save_problem(tmp_path / "checkpoint-2")
    assert resume_checkpoint(str(tmp_path), True) == tmp_path / "checkpoint-1"


def test_only_cut_off_checkpoints_train_from_step_0_and_an_explicit_one_is_refused(tmp_path, caplog):
    """Killed during the first save: resume true starts at step 0, saying so; naming a cut-off checkpoint is
    refused with the newest complete one to use instead."""
    begin_save(tmp_path / "checkpoint-1")
    with caplog.at_level(logging.WARNING, logger="taspo_trl"):
        check_resume_target(str(tmp_path), True)
        assert resume_checkpoint(str(tmp_path), True) is None
    assert "no complete checkpoint: training from step 0" in caplog.text
    _write_checkpoint(tmp_path / "checkpoint-2", 2)
    begin_save(tmp_path / "checkpoint-3")
    with pytest.raises(ValueError, match=r"checkpoint-3 is incomplete \(its save was cut off.*resume from .*checkpoint-2"):
        check_resume_target(str(tmp_path), str(tmp_path / "checkpoint-3"))


def test_rotation_counts_complete_checkpoints_and_says_what_it_removes(tmp_path, caplog):
    """save_total_limit 2 keeps the two newest *complete* checkpoints (transformers' rotation counted a cut-off
    checkpoint-3 and deleted complete ones for it); the cut-off one, superseded, is removed with a warning."""
    for step in (1, 2, 4):
        _write_checkpoint(tmp_path / f"checkpoint-{step}", step)
    begin_save(tmp_path / "checkpoint-3")
    begin_save(tmp_path / "checkpoint-9")  # newer than the save: not superseded, left alone
    with caplog.at_level(logging.WARNING, logger="taspo_trl"):
        checkpoints.rotate_complete_checkpoints(tmp_path, 2, None, keep=tmp_path / "checkpoint-4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-9"]
    assert "removing" in caplog.text and "checkpoint-3" in caplog.text and "checkpoint-4 supersedes it" in caplog.text


# --- point 3: the final model ---------------------------------------------------------------------------------


def test_a_final_model_is_complete_only_when_its_save_finished(tmp_path):
    """A requeued finished job exits 0 only over a complete final model (taspo-train saves it again otherwise:
    the `-m slow` kills in the final save run that end to end)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "turns.jsonl").write_text("{}\n")  # the run's own files are not part of the model
    before = begin_save(out)
    save_file({"w": torch.zeros(64)}, str(out / "model.safetensors"))
    (out / "config.json").write_text("{}")
    assert "its save was cut off" in checkpoints.final_model_problem(out)
    end_save(out, {"step": 3, **IDENTITY}, before=before)
    assert checkpoints.final_model_problem(out) is None
    assert set(checkpoints.read_marker(out)["files"]) == {"model.safetensors", "config.json"}
    (out / "turns.jsonl").write_text("{}\n{}\n")  # a resumed run appends to its log: the model stays complete
    assert checkpoints.final_model_problem(out) is None
    _cut(out / "model.safetensors")
    assert "model.safetensors has" in checkpoints.final_model_problem(out)
    (out / COMPLETE).unlink()  # a model saved before the markers: judged by its weights
    assert "model.safetensors is cut off" in checkpoints.final_model_problem(out)


# --- point 10: a damaged optimizer.pt, another run's checkpoint, a full disk ----------------------------------------


class _Trainer:
    """Stands in for transformers' Trainer under CheckpointSaving: loads and saves as it does, or fails as told."""

    def __init__(self, output_dir: Path, fail: BaseException | None = None):
        self.args = SimpleNamespace(output_dir=str(output_dir), save_total_limit=None, should_save=True)
        self.state = SimpleNamespace(global_step=2, best_model_checkpoint=None)
        self.accelerator = SimpleNamespace(wait_for_everyone=lambda: None)
        self.model, self.fail = torch.nn.Linear(4, 4), fail

    def _get_output_dir(self, trial):
        return self.args.output_dir

    def _save_checkpoint(self, model, trial):
        if self.fail:
            raise self.fail
        _write_checkpoint(Path(self.args.output_dir) / "checkpoint-2", 2, marked=False)

    def _load_optimizer_and_scheduler(self, checkpoint):
        torch.load(os.path.join(checkpoint, "optimizer.pt"), weights_only=True)


class _Saving(CheckpointSaving, _Trainer):
    pass


def test_a_damaged_optimizer_file_names_its_checkpoint(tmp_path):
    _write_checkpoint(tmp_path / "checkpoint-2", 2)
    (tmp_path / "checkpoint-2" / "optimizer.pt").write_bytes(b"\0" * 400)  # same kind of damage a bad disk leaves
    with pytest.raises(RuntimeError) as raised:
        _Saving(tmp_path)._load_optimizer_and_scheduler(str(tmp_path / "checkpoint-2"))
    assert str(tmp_path / "checkpoint-2") in str(raised.value) and "optimizer.pt" in str(raised.value)
    assert "--resume_from_checkpoint" in str(raised.value)


@pytest.mark.parametrize("fault", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),  # torch.save's writer
    type("SafetensorError", (Exception,), {})(  # as safetensors' save_file says it (seen on a full tmpfs)
        "Error while serializing: I/O error: No space left on device (os error 28)"),
])
def test_a_full_disk_during_a_save_names_the_folder_and_the_rerun(tmp_path, fault):
    """ENOSPC (as Python raises it) or torch.save's writer failing (how it reports a full disk): one message with
    the checkpoint, the folder, its free space and the rerun; the checkpoint stays marked as cut off."""
    with pytest.raises(checkpoints.SaveFailed) as raised:
        _Saving(tmp_path, fail=fault)._save_checkpoint(None, None)
    message = str(raised.value)
    assert f"could not save checkpoint-2 in {tmp_path / 'checkpoint-2'}" in message
    assert "free there" in message and "--resume_from_checkpoint true" in message
    assert ("the disk is full" in message) == ("No space left" in str(fault))
    assert checkpoints.save_problem(tmp_path / "checkpoint-2") == f"its save was cut off ({STARTED} without {COMPLETE})"


def test_a_save_is_marked_complete_last(tmp_path):
    trainer = _Saving(tmp_path)
    trainer._save_checkpoint(None, None)
    marker = json.loads((tmp_path / "checkpoint-2" / COMPLETE).read_text())
    assert marker["step"] == 2 and marker["trainer"] == "_Saving" and "optimizer.pt" in marker["files"]
    assert not (tmp_path / "checkpoint-2" / STARTED).exists()


def test_a_checkpoint_of_another_method_or_model_is_refused_and_another_base_name_warned(tmp_path):
    folder = _write_checkpoint(tmp_path / "checkpoint-1", 1)
    other_method = {**IDENTITY, "trainer": "TASPOTrainer"}
    refusals, warnings = checkpoints.identity_problems(folder, other_method)
    assert refusals == ["trainer AgentGRPOTrainer there, TASPOTrainer in this run"] and not warnings
    other_model = {**IDENTITY, "base_model": "moved/tiny", "model_shape": {**IDENTITY["model_shape"], "hidden_size": 16}}
    refusals, warnings = checkpoints.identity_problems(folder, other_model)
    assert refusals == ["model hidden_size 8 there, 16 in this run"]
    assert "trained from tiny, this run loads moved/tiny" in warnings[0]
    (folder / COMPLETE).unlink()  # an older checkpoint: its config.json still tells the model's shape
    assert checkpoints.identity_problems(folder, other_model)[0] == ["model hidden_size 8 there, 16 in this run"]


# --- point 2: output_dir writable and with room, before any work ---------------------------------------------------


def _run(*argv: str, cwd: Path, env: dict | None = None, module: str = "taspo_trl.cli", **kwargs):
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers"), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", module, *argv] if module else [sys.executable, *argv]
    return subprocess.run(command, cwd=cwd, env={**os.environ, "PYTHONPATH": path, **(env or {})},
                          capture_output=True, text=True, timeout=600, **kwargs)


def _train_argv(tiny_model_dir: str, games_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    """The CPU GRPO quickstart on the tiny model, 3 steps, a checkpoint each step, a reward that differs between
    siblings (so every step changes the weights)."""
    return ["--config", "alfworld_grpo_cpu", "--model_name_or_path", tiny_model_dir, "--games_dir", str(games_dir),
            "--output_dir", str(output_dir), "--max_turns", "2", "--max_completion_length", "8", "--bf16", "false",
            "--max_steps", "3", "--per_device_train_batch_size", "2", "--num_generations", "2",
            "--gradient_accumulation_steps", "1", "--save_strategy", "steps", "--save_steps", "1",
            "--save_total_limit", "2", "--learning_rate", "1e-2", "--reward_funcs", "survival_rewards.length",
            "--report_to", "none", *extra]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A working directory with the reward module `--reward_funcs` imports."""
    folder = tmp_path_factory.mktemp("survival")
    (folder / "survival_rewards.py").write_text(
        "def length(completions, **kwargs):\n    return [float(len(str(c))) for c in completions]\n")
    return folder


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_output_dir_is_refused_before_the_model_loads(tmp_path, tiny_model_dir, family_games_dir,
                                                                    workdir):
    locked = tmp_path / "read_only"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        done = _run(*_train_argv(tiny_model_dir, family_games_dir, locked / "out"), cwd=workdir)
    finally:
        locked.chmod(0o700)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"output_dir {locked / 'out'} is not writable" in done.stderr and "fix its permissions" in done.stderr


def test_an_unwritable_output_dir_is_refused_naming_it(tmp_path, monkeypatch):
    """(As root, a read-only folder is writable: the write is made to fail as a read-only disk fails it.)"""
    real_open = Path.open

    def read_only(self, mode="r", *args, **kwargs):
        if "w" in mode and self.name.startswith(".write_check"):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    with pytest.raises(ValueError, match=r"output_dir .*out is not writable \(Read-only file system\).*--output_dir"):
        checkpoints.hold_output_dir(tmp_path / "out")
    assert not list((tmp_path / "out").glob(".write_check*"))


def test_too_little_free_space_for_one_checkpoint_is_refused_before_training(tmp_path, monkeypatch):
    trainer = _Saving(tmp_path)
    trainer.model = torch.nn.Linear(1000, 1000)  # 4 MB of float32 weights, 8 MB of AdamW state
    trainer.args.save_strategy, trainer.args.save_only_model = "steps", False
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=5 * 2**20))
    with pytest.raises(ValueError) as raised:
        checkpoints.check_free_space(trainer)
    assert str(raised.value) == (
        f"output_dir {tmp_path} has 5.0 MB free on its disk, and one save of this run takes about 11.5 MB (weights "
        "3.8 MB + optimizer state 7.6 MB): free space there, or pick an --output_dir on a bigger disk")
    trainer.args.save_strategy = "no"  # only the final model is saved
    checkpoints.check_free_space(trainer)


# --- point 4: one run per output_dir ----------------------------------------------------------------------------


HOLD = ("import sys, time; from taspo_trl.checkpoints import hold_output_dir; hold_output_dir(sys.argv[1]); "
        "print('held', flush=True); time.sleep(600)")


def test_a_second_run_on_a_held_output_dir_is_refused_in_seconds(tmp_path, tiny_model_dir, family_games_dir, workdir):
    """A run holds output_dir (here a process that took the lock as taspo-train does); taspo-train on the same
    folder stops before the model loads, naming the other run's process and host. When the holder is gone
    (killed: the kernel drops the lock), the folder is free again."""
    out = tmp_path / "out"
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env={**os.environ, "PYTHONPATH": path},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        done = _run(*_train_argv(tiny_model_dir, family_games_dir, out), cwd=workdir)
        took = time.monotonic() - started
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert f"output_dir {out} is in use by another run (process {holder.pid} on host " in done.stderr
        assert "pick another --output_dir" in done.stderr
        # refused before the model loads (the imports take the seconds; the lock is never waited for): a bound
        # that only a run that waited for the other would pass, loose enough for a loaded machine
        assert "[taspo-train] method=" not in done.stdout and not list(out.glob("checkpoint-*"))
        assert took < 180, took
    finally:
        holder.kill()
        holder.wait()
    assert checkpoints.hold_output_dir(out) and (out / LOCK).is_file()  # free again once the holder died
    checkpoints.release_output_dir(out)


def test_ranks_of_one_launch_do_not_refuse_each_other(tmp_path, monkeypatch):
    """Only the launch's main process (RANK 0) takes the lock; the other ranks check the folder and go on."""
    out = tmp_path / "out"
    assert checkpoints.hold_output_dir(out)
    monkeypatch.setenv("RANK", "1")
    assert checkpoints.hold_output_dir(out) is False  # no refusal, no second lock
    monkeypatch.setenv("RANK", "0")
    assert checkpoints.hold_output_dir(out) is False  # this process holds it already
    checkpoints.release_output_dir(out)


def test_a_rerun_over_a_saved_model_is_refused(tmp_path):
    """save_strategy no leaves only the model: a second run into the folder would replace it silently."""
    from taspo_trl.cli import check_output_dir

    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"already holds a saved model \(model.safetensors\).*--overwrite_output_dir"):
        check_output_dir(str(tmp_path), None, False)
    check_output_dir(str(tmp_path), None, True)


# --- point 10: duplicate recipe keys ------------------------------------------------------------------------------


def test_a_recipe_key_given_twice_is_refused_naming_the_key_file_and_lines(tmp_path):
    from taspo_trl.script_args import resolve_config_argv

    recipe = tmp_path / "mine.yaml"
    recipe.write_text("method: grpo\nlearning_rate: 1.0e-6\nmax_steps: 10\nlearning_rate: 1.0e-3\n")
    with pytest.raises(SystemExit) as stopped:
        resolve_config_argv(["--config", str(recipe)], "taspo-train")
    assert str(stopped.value) == (f"taspo-train: --config {recipe}: key 'learning_rate' appears twice (lines 2 and "
                                  "4); YAML would keep only the last, so remove the one you did not mean.")
    recipe.write_text("env:\n  A: 1\n  A: 2\n")  # nested blocks too
    with pytest.raises(SystemExit, match="key 'A' appears twice"):
        resolve_config_argv(["--config", str(recipe)], "taspo-train")


# --- slow: real training processes killed inside a save -----------------------------------------------------------


def _weights(path: Path) -> dict:
    return load_file(str(path))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, family_games_dir, workdir) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    done = _run(*_train_argv(tiny_model_dir, family_games_dir, out), cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


KILL_POINTS = [
    *(f"{name}:{when}:checkpoint-2" for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                                                 "trainer_state.json") for when in ("before", "during")),
    # after the last file = before the marker; the marker written atomically (during = its temporary file)
    "trainer_state.json:after:checkpoint-2", "_save_complete.json:during:checkpoint-2",
    "_save_complete.json:after:checkpoint-2", "rotation:after:checkpoint-3",
    # the final model in output_dir (named "out")
    "model.safetensors:during:out", "trainer_state.json:after:out",
]


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_a_run_killed_inside_a_save_resumes_to_the_uninterrupted_model(kill_at, tmp_path, tiny_model_dir,
                                                                      family_games_dir, workdir, uninterrupted):
    """SIGKILL at one moment of a save, then the same command with --resume_from_checkpoint true: it finishes, and
    its final model equals the uninterrupted run's bit for bit."""
    out = tmp_path / "out"
    argv = _train_argv(tiny_model_dir, family_games_dir, out)
    killed = _run("-c", "import kill_during_save; kill_during_save.main()", *argv, cwd=workdir, module="",
                  env={"TASPO_KILL_AT": kill_at})
    assert killed.returncode == -9, killed.stderr[-3000:]
    rerun = _run(*argv, "--resume_from_checkpoint", "true", cwd=workdir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    name, when, folder = kill_at.split(":")
    if folder == "checkpoint-2" and name != "rotation" and not (name == COMPLETE and when == "after"):
        assert "skipping" in rerun.stderr and "checkpoint-2: incomplete" in rerun.stderr
    if folder == "out":
        assert "the final model in" in rerun.stderr and "is incomplete" in rerun.stderr
    assert checkpoints.final_model_problem(out) is None
    assert [p.name for p in checkpoints.checkpoints_newest_first(out)] == ["checkpoint-3", "checkpoint-2"]
    expected, got = _weights(uninterrupted / "model.safetensors"), _weights(out / "model.safetensors")
    assert expected.keys() == got.keys()
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key
    start = _weights(Path(tiny_model_dir) / "model.safetensors")
    assert any(not torch.equal(start[key], tensor) for key, tensor in expected.items())  # training moved them


@pytest.mark.slow
def test_two_real_runs_on_one_folder_the_second_refused_in_seconds(tmp_path, tiny_model_dir, family_games_dir, workdir):
    """Two taspo-train runs on one folder: while the first trains, the second stops before its model loads, naming
    the first's process and host (the old check saw only checkpoint-N folders, so a second run started before the
    first save trained into the same folder)."""
    out = tmp_path / "out"
    # still training when the second starts
    argv = _train_argv(tiny_model_dir, family_games_dir, out, "--max_steps", "500")
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers"), os.environ.get("PYTHONPATH", "")])
    first = subprocess.Popen([sys.executable, "-m", "taspo_trl.cli", *argv], cwd=workdir, text=True,
                             env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in first.stdout:  # the first run is training
            if line.startswith("[taspo-train] method="):
                break
        started = time.monotonic()
        second = _run(*argv, cwd=workdir)
        took = time.monotonic() - started
        assert first.poll() is None  # the first is still running
        assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr[-2000:]
        assert f"is in use by another run (process {first.pid} on host" in second.stderr, second.stderr[-2000:]
        assert "[taspo-train] method=" not in second.stdout and took < 180, took  # before its model loads
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_resuming_another_methods_checkpoint_is_refused(tmp_path, tiny_model_dir, family_games_dir, workdir,
                                                        uninterrupted):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-2", out / "checkpoint-2")
    done = _run(*_train_argv(tiny_model_dir, family_games_dir, out, "--method", "taspo",
                             "--resume_from_checkpoint", "true"), cwd=workdir)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "was written by another run (trainer AgentGRPOTrainer there, TASPOTrainer in this run)" in done.stderr


def test_transformers_still_rotates_inside_save_checkpoint_by_the_setting_set_aside():
    """CheckpointSaving sets ``args.save_total_limit`` aside during transformers' ``_save_checkpoint`` (whose
    rotation would run before the complete marker) and rotates after it; and it wraps these loaders."""
    import inspect

    from transformers import Trainer

    assert "save_total_limit=self.args.save_total_limit" in inspect.getsource(Trainer._save_checkpoint)
    assert list(inspect.signature(Trainer._load_optimizer_and_scheduler).parameters) == ["self", "checkpoint"]
    assert list(inspect.signature(Trainer._load_from_checkpoint).parameters)[:2] == ["self", "resume_from_checkpoint"]
    assert "get_last_checkpoint" in inspect.getsource(Trainer.train)  # what resume true would take without us
