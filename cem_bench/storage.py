"""Files of results, local or on object storage (``s3://``, ``gs://``, any pyarrow.fs URI), written atomically.

One way to write: ``write_bytes`` (and ``write_json`` on top of it; ``integrity`` adds the Parquet tables and
the checksums) writes a temporary
file and renames it into place locally, and does a single PUT on object stores (which are atomic per
object), so a crash never leaves a half-written file. ``Dir`` reads a folder the same way on both.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any


def is_uri(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def resolve_storage(storage: str | None) -> str:
    """``None`` -> ``./results`` made absolute; a URI (``s3://``, ``gs://``, ...) unchanged; a path absolute."""
    storage = "results" if storage is None else str(storage)
    if is_uri(storage):
        return storage.rstrip("/")
    return os.path.abspath(os.path.expanduser(storage))


def join(base: str, *parts: str) -> str:
    base = str(base)
    if is_uri(base):
        return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])
    return os.path.join(base, *parts)


def filesystem(path: str):
    """(pyarrow filesystem, path on it) for a local path or a URI."""
    import pyarrow.fs as pafs
    path = str(path)
    if is_uri(path):
        if path.startswith("file://"):
            return pafs.LocalFileSystem(), _local(path)
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def exists(path: str) -> bool:
    import pyarrow.fs as pafs
    fs, p = filesystem(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def write_bytes(path: str, data: bytes) -> None:
    """Write a file atomically: temp file + ``os.replace`` locally; a single PUT on object stores."""
    path = str(path)
    if not is_uri(path) or path.startswith("file://"):
        path = _local(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    fs, p = filesystem(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as out:
        out.write(data)


def jsonable(obj: Any) -> Any:
    """Result dicts as strict JSON (NaN/inf as null, tensors as lists)."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "tolist") and callable(obj.tolist) and type(obj).__module__.startswith(("torch", "numpy")):
        return jsonable(obj.tolist())
    return obj


def json_bytes(obj: Any) -> bytes:
    """A result as the JSON cem-bench writes (strict: NaN as null; indented)."""
    return json.dumps(jsonable(obj), indent=2).encode()


def write_json(path: str, obj: Any) -> None:
    write_bytes(path, json_bytes(obj))


def nearest_existing(path: str) -> str:
    """``path`` itself when it exists, else its nearest existing parent (local paths)."""
    path = _local(str(path))
    while path and not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "."



def copy_file(src: str, dest: str) -> None:
    """Copy a local file to a local path or a URI, atomically."""
    if not is_uri(dest):
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        tmp = f"{dest}.tmp{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        return
    with open(src, "rb") as fh:
        write_bytes(dest, fh.read())


class Dir:
    """A local folder or a pyarrow-fs URI, read the same way."""

    def __init__(self, path: str | os.PathLike):
        path = str(path)
        self.uri = is_uri(path) and not path.startswith("file://")
        if self.uri:
            self.fs, self.root = filesystem(path.rstrip("/"))
            self.display = path.rstrip("/")
        else:
            self.root = os.path.abspath(os.path.expanduser(_local(path)))
            self.display = self.root

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts]) if self.uri else os.path.join(self.root, *parts)

    def url(self, *parts: str) -> str:
        """A path for ``write_bytes`` and friends: the local path, or the URI."""
        return "/".join([self.display, *parts]) if self.uri else self.join(*parts)

    def is_dir(self) -> bool:
        if not self.uri:
            return os.path.isdir(self.root)
        import pyarrow.fs as pafs
        return self.fs.get_file_info(self.root).type == pafs.FileType.Directory

    def subdirs(self) -> list[str]:
        if not self.uri:
            return sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        import pyarrow.fs as pafs
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=False))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def exists(self, *parts: str) -> bool:
        if not self.uri:
            return os.path.exists(self.join(*parts))
        import pyarrow.fs as pafs
        return self.fs.get_file_info(self.join(*parts)).type != pafs.FileType.NotFound

    def kind(self, *parts: str) -> str:
        """``"missing"``, ``"file"`` or ``"dir"``."""
        if not self.uri:
            path = self.join(*parts)
            return "dir" if os.path.isdir(path) else ("file" if os.path.lexists(path) else "missing")
        import pyarrow.fs as pafs
        t = self.fs.get_file_info(self.join(*parts)).type
        return {pafs.FileType.NotFound: "missing", pafs.FileType.Directory: "dir"}.get(t, "file")

    def read_bytes_or_raise(self, *parts: str) -> bytes:
        """The file's bytes; OSError (FileNotFoundError, IsADirectoryError, ...) as it comes."""
        if not self.uri:
            with open(self.join(*parts), "rb") as fh:
                return fh.read()
        with self.fs.open_input_stream(self.join(*parts)) as fh:
            return fh.read()

    def read_bytes(self, *parts: str) -> bytes | None:
        try:
            if not self.uri:
                with open(self.join(*parts), "rb") as fh:
                    return fh.read()
            with self.fs.open_input_stream(self.join(*parts)) as fh:
                return fh.read()
        except (FileNotFoundError, OSError):
            return None

    def read_text(self, *parts: str) -> str | None:
        data = self.read_bytes(*parts)
        return None if data is None else data.decode("utf-8", errors="replace")

    def mtime(self, *parts: str) -> float | None:
        if not self.uri:
            try:
                return os.path.getmtime(self.join(*parts))
            except OSError:
                return None
        info = self.fs.get_file_info(self.join(*parts))
        return info.mtime.timestamp() if info.mtime is not None else None
