"""Manifests of cache entries: every file's size and SHA-256, checked when the entry is loaded.

Every cache that taspo_trl writes or reads is covered: the converted embedded model and the warm starts
(``models.py``, ``warmstart.py``), the bm25 indexes (``envs/search/retrieval.py``), the analyzer's answers
(``privileged/analyzers.py``, one digest inside each entry) and the shipped sentence encoder
(``privileged/encoder.py``, against the hashes of its wheel's ``RECORD``).

Cost: hashing the 538 MB converted model takes about half a second on a CPU, more than the rest of a load,
and the tests and every ``taspo-train``/``taspo-eval`` start load it. So sizes are checked on every load, and the
hashes only when a file's stat signature (size, mtime in ns, inode) differs from the one recorded at the last
full check: a truncated, rewritten or replaced file always differs, so its hash is checked; a copy of the cache
(new inodes) is hashed once, then signed again. What this leaves out is damage that changes neither size nor
mtime (bit rot under an unchanged inode); ``check_folder(..., full=True)`` hashes everything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path

MANIFEST_NAME = ".taspo_manifest.json"
_CHUNK = 1 << 22

Expected = dict[str, tuple[int, str]]
"""relative path -> (size in bytes, SHA-256 hex digest)"""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    """The digest a single-file entry (an analyzer answer) stores next to its text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _signature(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def write_manifest(folder: Path) -> None:
    """Record the size and SHA-256 of every file under ``folder`` (call it on a finished entry, before the rename
    that publishes it)."""
    files = {name: {"size": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)} for name in _files(folder)}
    _write_json(folder / MANIFEST_NAME, {"files": files, "signed": {name: _signature(folder / name) for name in files}})


def has_manifest(folder: Path) -> bool:
    return (folder / MANIFEST_NAME).is_file()


def check_folder(folder: Path, full: bool = False) -> str | None:
    """What is wrong with cache entry ``folder`` against its manifest (a file missing, of another size, or with
    another hash), or None when it is intact. See the module docstring for when hashes are computed."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        expected = {name: (int(entry["size"]), str(entry["sha256"])) for name, entry in manifest["files"].items()}
        signed = dict(manifest.get("signed") or {})
    except FileNotFoundError:
        return f"{folder} has no {MANIFEST_NAME} (written by an older taspo-trl, or not by taspo-trl)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"its manifest {folder / MANIFEST_NAME} is unreadable ({type(error).__name__})"
    problem, resigned = check_files(folder, expected, signed, full)
    if problem is None and resigned != signed:
        manifest["signed"] = resigned
        try:
            _write_json(folder / MANIFEST_NAME, manifest)
        except OSError:
            pass  # a read-only cache: the hashes are checked again next time
    return problem


def check_files(root: Path, expected: Expected, signed: dict[str, list[int]], full: bool = False) -> tuple[str | None, dict[str, list[int]]]:
    """Check the files of ``expected`` under ``root``: sizes always, hashes where ``full`` or where a file's stat
    signature is not its entry in ``signed``. Returns the first problem (or None) and the signatures of the files
    now known intact."""
    for name, (size, _) in expected.items():
        path = root / name
        if not path.is_file():
            return f"{path} is missing", signed
        actual = path.stat().st_size
        if actual != size:
            return f"{path} has {actual} bytes, its manifest says {size}", signed
    resigned = {}
    for name, (_, digest) in expected.items():
        path = root / name
        signature = _signature(path)
        if full or signed.get(name) != signature:
            if file_sha256(path) != digest:
                return f"{path} does not match its manifest's SHA-256 (the file was changed or damaged)", signed
        resigned[name] = signature
    return None, resigned


def check_installed_files(distribution: str, folder: Path, signatures: Path) -> str | None:
    """Check the files under ``folder`` that the installed package ``distribution`` shipped against the sizes and
    SHA-256 hashes of its wheel's ``RECORD`` (the package's own manifest), or None when they match or the package
    recorded none. The stat signatures of the last full check are kept in the file ``signatures`` (outside the
    package, which may be read-only)."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    root = Path(str(dist.locate_file(""))).resolve()
    expected = {}
    for file in dist.files or []:
        path = Path(str(dist.locate_file(file))).resolve()
        if file.hash is not None and file.hash.mode == "sha256" and file.size and folder.resolve() in path.parents:
            expected[str(path.relative_to(root))] = (int(file.size), base64.urlsafe_b64decode(file.hash.value + "==").hex())
    try:
        signed = dict(json.loads(signatures.read_text()))
    except (OSError, ValueError, TypeError):
        signed = {}
    problem, resigned = check_files(root, expected, signed)
    if problem is None and resigned != signed:
        try:
            signatures.parent.mkdir(parents=True, exist_ok=True)
            _write_json(signatures, resigned)
        except OSError:
            pass  # nowhere to remember them: the hashes are checked again next time
    return problem


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with the framing of a ``.safetensors`` file (a header length past the end, a header that is not
    JSON, data that ends before or after the file does), or None: a cheap check (the header only) that catches a
    truncated or partly written file in a folder that has no manifest."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or length > size - 8:
                return f"{path} is cut off ({size} bytes, too short for its own header)"
            header = json.loads(handle.read(length))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{path} has a damaged header"
    if 8 + length + end != size:
        return f"{path} has {size} bytes, its header describes {8 + length + end} (cut off or partly written)"
    return None


def structural_problem(folder: Path) -> str | None:
    """The first ``safetensors_problem`` of ``folder``'s weight files, or a JSON file that does not parse."""
    for path in sorted(folder.glob("*.safetensors")):
        if problem := safetensors_problem(path):
            return problem
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return f"{path} is not valid JSON (cut off or damaged)"
    return None


def adopt_or_check(folder: Path) -> str | None:
    """``check_folder`` for an entry with a manifest. An entry written before manifests existed is checked for its
    structure (``structural_problem``) and, when sound, given a manifest now (where the cache is writable)."""
    if has_manifest(folder):
        return check_folder(folder)
    if problem := structural_problem(folder):
        return problem
    try:
        write_manifest(folder)
    except OSError:
        pass
    return None


def _write_json(path: Path, data: object) -> None:
    """Write then rename, so a concurrent reader never sees half a manifest."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.", suffix=".tmp") as handle:
        json.dump(data, handle)
    os.replace(handle.name, path)
