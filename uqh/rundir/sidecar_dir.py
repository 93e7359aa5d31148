"""What the judge and probe directories share: a versioned manifest and one JSONL file of records keyed to the
steps or episodes of recorded runs, read torn-line safe with the first line of each key kept."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from uqh.rundir import integrity
from uqh.rundir.errors import UserError
from uqh.rundir.reader import read_jsonl_first_per_key, read_versioned_json

R = TypeVar("R", bound=BaseModel)


def read_dir_manifest(directory: Path, manifest_file: str, model: type[BaseModel], what: str, how_to_make: str) -> Any:
    """The manifest of a sidecar directory; one line (UserError) naming the command that makes one otherwise."""
    directory = Path(directory)
    path = directory / manifest_file
    if not directory.is_dir() or not path.is_file():
        raise UserError(f"{directory} is not a {what} directory (no {manifest_file}); run `{how_to_make} "
                        f"--out {directory}` first")
    return read_versioned_json(path, model, f"{what} manifest")


@dataclass
class SidecarDir(Generic[R]):
    """A sidecar directory opened for reading (subclasses name its files and record type); it never writes."""

    MANIFEST_FILE: ClassVar[str]
    MANIFEST: ClassVar[type[BaseModel]]
    RECORDS_FILE: ClassVar[str]
    RECORD: ClassVar[type[BaseModel]]
    #: "judge" / "probe", and the command that makes such a directory (for the one-line error)
    KIND: ClassVar[str]
    MADE_BY: ClassVar[str]

    path: Path
    manifest: Any
    duplicate_lines: int = 0
    _records: list | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: str | Path):
        """Open the directory at ``path``; UserError (one line) when it is not one of this kind."""
        path = Path(path)
        return cls(path=path, manifest=read_dir_manifest(path, cls.MANIFEST_FILE, cls.MANIFEST, cls.KIND, cls.MADE_BY))

    @property
    def config(self) -> Any:
        return self.manifest.config

    def records(self) -> list[R]:
        """The records in file order, torn-line safe, the first line of each ``key`` kept (cached)."""
        if self._records is None:
            self._records, self.duplicate_lines = read_jsonl_first_per_key(
                self.path / self.RECORDS_FILE, self.RECORD, lambda r: r.key)
        return self._records

    def complete_length(self) -> int:
        """Bytes of the records file up to and including its last newline (the rest is a torn line)."""
        path = self.path / self.RECORDS_FILE
        return integrity.complete_length(path) if path.exists() else 0
