"""Run ``taspo-train`` and SIGKILL it at one chosen moment of a save: the fault a preempted machine, an OOM killer
or ``kill -9`` leaves behind. Test-only; run with tests/helpers on ``PYTHONPATH`` as

    python -c "import kill_during_save; kill_during_save.main()" TRAIN_ARGS...

with ``TASPO_KILL_AT=FILE:WHEN:FOLDER`` in the environment: ``FILE`` is the file whose write is the moment
(``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``,
``_save_complete.json``, or ``rotation`` for the removal of old checkpoints), ``WHEN`` is ``before`` (nothing of it
written), ``during`` (half of its bytes written, as a kill in the middle of the write leaves it) or ``after`` (it
was written whole), and ``FOLDER`` the name of the folder it is written to (``checkpoint-2``, or the output_dir's
name for the final model). Every other write happens as usual.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(spec: str) -> None:
    import safetensors.torch
    import torch
    import transformers.modeling_utils
    from transformers.trainer_callback import TrainerState

    target, when, folder = spec.split(":")

    def aimed(path: object) -> bool:
        path = Path(str(path))
        return path.parent.name == folder and path.name.lstrip(".").removesuffix(".tmp") == target

    def wrap(write_whole, serialize):
        """``write_whole(path)`` writes the file; ``serialize()`` gives its bytes for a half write."""
        def write(path):
            if not aimed(path):
                return write_whole(path)
            if when == "before":
                _die()
            if when == "during":
                data = serialize()
                with open(path, "wb") as handle:
                    handle.write(data[: len(data) // 2])
                _die()
            write_whole(path)
            _die()
        return write

    real_torch_save = torch.save

    def torch_save(obj, f, *args, **kwargs):
        def serialize():
            buffer = io.BytesIO()
            real_torch_save(obj, buffer, *args, **kwargs)
            return buffer.getvalue()
        return wrap(lambda path: real_torch_save(obj, path, *args, **kwargs), serialize)(f)

    torch.save = torch_save

    real_safe_save = transformers.modeling_utils.safe_save_file

    def safe_save_file(tensors, filename, metadata=None):
        return wrap(lambda path: real_safe_save(tensors, path, metadata=metadata),
                    lambda: safetensors.torch.save(tensors, metadata=metadata))(filename)

    transformers.modeling_utils.safe_save_file = safe_save_file

    real_state_save = TrainerState.save_to_json

    def save_to_json(self, json_path):
        text = json.dumps({"global_step": self.global_step, "log_history": self.log_history}, indent=2)
        return wrap(lambda path: real_state_save(self, path), lambda: text.encode())(json_path)

    TrainerState.save_to_json = save_to_json

    try:
        import taspo_trl.checkpoints as checkpoints
    except ImportError:  # code from before the save markers (to show what a kill did there)
        return
    real_marker = checkpoints._write_json_atomically

    def write_json_atomically(path, data):
        path = Path(path)
        if not aimed(path):
            return real_marker(path, data)
        temporary = path.with_name(f".{path.name}.tmp")
        return wrap(lambda _: real_marker(path, data), lambda: json.dumps(data).encode())(temporary)

    checkpoints._write_json_atomically = write_json_atomically

    real_rotate = checkpoints.rotate_complete_checkpoints

    def rotate(output_dir, limit, best, keep):
        if target == "rotation" and keep.name == folder:
            if when == "before":
                _die()
            real_rotate(output_dir, limit, best, keep)
            _die()
        return real_rotate(output_dir, limit, best, keep)

    checkpoints.rotate_complete_checkpoints = rotate


def main() -> None:
    if os.environ.get("TASPO_KILL_AT"):
        install(os.environ["TASPO_KILL_AT"])
    from taspo_trl.cli import train_main

    train_main(sys.argv[1:])
