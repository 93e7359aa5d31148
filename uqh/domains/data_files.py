"""Data files the domains read, plain or gzip-compressed: found by their original name (``NAME`` or ``NAME.gz``),
read as text, and hashed as the original file, so a compressed copy records the sha256 of the file it was made
from (the demo data shipped in ``uqh/domains/*/data/`` is stored that way; each folder's SOURCES.md gives the
origin, licence and those hashes)."""
from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

GZIP_SUFFIX = ".gz"


def find_data_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` if it is a file, else ``folder/name.gz``, else None."""
    for candidate in (folder / name, folder / (name + GZIP_SUFFIX)):
        if candidate.is_file():
            return candidate
    return None


def original_suffix(path: Path) -> str:
    """The suffix of the file before compression: ``.jsonl`` for ``x.jsonl.gz`` and for ``x.jsonl``."""
    return Path(path.name[: -len(GZIP_SUFFIX)]).suffix if path.name.endswith(GZIP_SUFFIX) else path.suffix


def read_data_bytes(path: Path) -> bytes:
    """The file's content, decompressed when its name ends in ``.gz``."""
    raw = Path(path).read_bytes()
    return gzip.decompress(raw) if str(path).endswith(GZIP_SUFFIX) else raw


def data_sha256(path: Path) -> str:
    """sha256 of the content (of the original file, for a ``.gz`` copy)."""
    return hashlib.sha256(read_data_bytes(path)).hexdigest()
