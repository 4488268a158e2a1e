"""Files of results, local or on object storage (``s3://``, ``gs://``, any pyarrow.fs URI), written atomically.

One way to write: ``write_bytes`` (and ``write_json`` on top of it; ``integrity`` adds the Parquet tables and
the checksums) writes a temporary
file and renames it into place locally, and does a single PUT on object stores (which are atomic per
object), so a crash never leaves a half-written file. ``Dir`` reads a folder the same way on both.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import stat
import time
from typing import Any


class UnsafePath(OSError):
    """A path cem-bench will not write or read: a symbolic link inside a results folder, a named pipe, a
    device, a file too large to be one cem-bench wrote. An OSError (EPERM) whose ``strerror`` is the whole
    message, naming the path and what to do: the CLI prints it as one line and exits 2, and a reader that
    reports unreadable files (integrity.read_strict) names it like any other."""

    def __init__(self, message: str):
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return self.strerror


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
    """(pyarrow filesystem, path on it) for a local path or a URI.

    An object-store URI goes to ``pyarrow.fs.FileSystem.from_uri`` as given, as Ray Tune's ``storage_path``
    does, so the driver, the trials, ``report`` and ``table`` all resolve it the same way: pyarrow's AWS SDK
    reads the standard variables (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an S3-compatible
    endpoint, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE`` / the instance profile,
    ``AWS_DEFAULT_REGION``); nothing of them is copied into Ray's pickled state. The first use of a bucket in a
    process checks it (:func:`_check_bucket`) so that a wrong endpoint, credential or bucket is one clear
    :class:`StorageUnavailable` instead of a pyarrow message about the first file touched."""
    import pyarrow.fs as pafs
    path = str(path)
    if is_uri(path):
        if path.startswith("file://"):
            return pafs.LocalFileSystem(), _local(path)
        fs, p = pafs.FileSystem.from_uri(path)
        _check_bucket(fs, path, p)
        return fs, p
    return pafs.LocalFileSystem(), os.path.abspath(path)


class StorageUnavailable(OSError):
    """An object store cem-bench cannot use: its endpoint unreachable, access refused, the bucket missing. An
    OSError whose ``strerror`` is the whole message (the CLI prints it as one line and exits 2)."""

    def __init__(self, message: str):
        super().__init__(errno.EIO, message)

    def __str__(self) -> str:
        return self.strerror


# the environment that decides where an s3:// URI goes and who asks: a checked bucket is checked again when it changes
_AWS_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
            "AWS_DEFAULT_REGION", "AWS_REGION")
# (scheme, bucket, query, environment) -> None when the bucket answered, else (when it failed, the message)
_CHECKED: dict[tuple, tuple[float, str] | None] = {}
_RECHECK_S = 10.0   # a failed check is repeated no sooner: one command asks several times, each ~6 s of SDK retries


def _endpoint(uri: str) -> str:
    query = uri.partition("?")[2]
    for part in query.split("&"):
        if part.startswith("endpoint_override="):
            return part.partition("=")[2]
    if uri.startswith("s3://"):
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(var):
                return f"{os.environ[var]} ({var})"
        return "AWS S3"
    return uri.split("://", 1)[0] + " storage"


def _aws_credentials() -> str | None:
    """Where the AWS SDK would find credentials, as far as the environment and files show; None when nowhere
    (an EC2 instance profile, reached over the network, cannot be seen from here)."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    if env.get("AWS_PROFILE"):
        return f"the profile {env['AWS_PROFILE']} (AWS_PROFILE)"
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return "AWS_WEB_IDENTITY_TOKEN_FILE"
    if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return "the container's credentials"
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), ("AWS_CONFIG_FILE", "~/.aws/config")):
        f = os.path.expanduser(env.get(var) or default)
        if os.path.isfile(f):
            return f
    if env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        return "the EC2 instance profile, if this machine has one"
    return None


def _check_bucket(fs, uri: str, path: str) -> None:
    """StorageUnavailable unless the bucket of ``uri`` answers (one HeadBucket, once per process while the
    AWS environment stays the same)."""
    import pyarrow.fs as pafs
    bucket = path.split("/", 1)[0]
    key = (uri.split("://", 1)[0], bucket, uri.partition("?")[2], tuple(os.environ.get(v) for v in _AWS_ENV))
    if key in _CHECKED:
        failed = _CHECKED[key]
        if failed is None:
            return
        if time.monotonic() - failed[0] < _RECHECK_S:
            raise StorageUnavailable(failed[1])
    shown = uri.partition("?")[0]
    s3 = uri.startswith("s3://")
    creds = _aws_credentials() if s3 else None
    try:
        kind = fs.get_file_info(bucket).type
    except OSError as e:
        text = " ".join(str(e).split())
        if any(w in text for w in ("NETWORK_CONNECTION", "curlCode", "connect to", "resolve host", "timed out")):
            why = (f"cannot reach {_endpoint(uri)}: {text.rpartition('Details: ')[2] or text}. Check the endpoint "
                   f"{'(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, or unset them for AWS itself) ' if s3 else ''}"
                   f"and that the server runs")
        elif s3 and creds is None:
            why = (f"no AWS credentials found (none of AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                   f"~/.aws/credentials), so the request went unsigned and {_endpoint(uri)} refused it ({text}). "
                   f"Set the credentials of an account that may use the bucket")
        elif any(w in text for w in ("ACCESS_DENIED", "HTTP status 403", "AccessDenied", "INVALID_ACCESS_KEY",
                                     "SIGNATURE_DOES_NOT_MATCH")):
            why = (f"access to the bucket '{bucket}' was refused by {_endpoint(uri)}"
                   f"{f' for the credentials from {creds}' if creds else ''} ({text}). Check the key and secret "
                   f"(or the profile / instance role) and that they may read and write the bucket")
        else:
            why = f"{_endpoint(uri)} answered an error for the bucket '{bucket}': {text}"
        message = f"{shown}: {why}"
    else:
        if kind != pafs.FileType.NotFound:
            _CHECKED[key] = None
            return
        mk = f" (`aws s3 mb s3://{bucket}`)" if s3 else ""
        message = (f"{shown}: the bucket '{bucket}' does not exist at {_endpoint(uri)}; create it{mk} or name an "
                   f"existing one (cem-bench never creates buckets)")
    _CHECKED[key] = (time.monotonic(), message)
    raise StorageUnavailable(message)


def relative_inside(root: str | os.PathLike, path: str) -> str | None:
    """``path`` (relative to ``root``, or absolute) as a path relative to ``root`` when it lies inside it,
    judged on the names alone (no ``..``, nothing empty); None otherwise. A path read from a results table
    (``trial_dir``) goes through this before it is joined to anything: a table may come from anyone."""
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    root = os.path.abspath(_local(str(root)))
    if os.path.isabs(path):
        for base in dict.fromkeys((root, os.path.realpath(root))):
            rel = os.path.relpath(os.path.normpath(path), base)
            if not (rel == os.curdir or rel.startswith(os.pardir)) and os.pardir not in path.split(os.sep):
                return rel
        return None
    parts = path.replace("\\", "/").split("/")
    if any(p in ("", os.curdir, os.pardir) for p in parts):
        return None
    return os.path.join(*parts)


def publish(stage: str | os.PathLike, root: str | os.PathLike, folders: list[str]) -> str:
    """Copy every file under the private folder ``stage`` into ``root/folders...`` (created when missing),
    each through :func:`_replace_in` and each folder through :func:`open_dir`: no link there is followed, a
    link in the way is refused (UnsafePath) before the first file is written. Returns the target folder."""
    root = os.path.abspath(str(root))
    os.makedirs(root, exist_ok=True)
    target = os.path.join(root, *folders)
    top = open_dir(root, folders, create=True)
    try:
        subdirs = sorted({os.path.relpath(d, stage) for d, _, files in os.walk(stage) if files} - {os.curdir})
        fds = {os.curdir: top}
        try:
            for sub in subdirs:   # every folder opened (and checked) before any file is written
                fds[sub] = open_dir(target, sub.split(os.sep), create=True)
            for d, _, files in os.walk(stage):
                rel = os.path.relpath(d, stage)
                for name in sorted(files):
                    with open(os.path.join(d, name), "rb") as fh:
                        _replace_in(fds[rel], name, fh.read(), os.path.join(target, rel, name))
        finally:
            for rel, fd in fds.items():
                if rel != os.curdir:
                    os.close(fd)
    finally:
        os.close(top)
    return target


def exists(path: str) -> bool:
    import pyarrow.fs as pafs
    fs, p = filesystem(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def write_bytes(path: str, data: bytes, *, within: str | os.PathLike | None = None) -> None:
    """Write a file atomically: a new temp file + rename locally; a single PUT on object stores.

    Locally nothing is written through a symbolic link: the temp file is created with ``O_EXCL |
    O_NOFOLLOW`` and renamed over the target, which replaces a link planted at the target instead of
    writing where it points. ``within`` (a folder above ``path``) extends that to the folders in between:
    each is opened without following a link (created when missing), and a link among them is refused
    with :class:`~cem_bench.errors.UnsafePath`. Results folders are shared and cem-bench often runs as root,
    so a folder of the user's own naming is trusted (``within`` itself, or ``path``'s parent when
    ``within`` is None) and nothing below it is."""
    path = str(path)
    if not is_uri(path) or path.startswith("file://"):
        path = os.path.abspath(_local(path))
        root = os.path.dirname(path) if within is None else os.path.abspath(_local(str(within)))
        rel = os.path.relpath(path, root)
        if rel.startswith(os.pardir) or os.path.isabs(rel) or rel == os.curdir:
            raise ValueError(f"write_bytes: {path} is not inside {root}")
        *folders, name = rel.split(os.sep)
        os.makedirs(root, exist_ok=True)
        fd = open_dir(root, folders, create=True)
        try:
            _replace_in(fd, name, data, path)
        finally:
            os.close(fd)
        return
    fs, p = filesystem(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as out:
        out.write(data)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_message(shown: str, name: str, dir_fd: int) -> str:
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return f"{shown} is not a folder"
    return (f"{shown} is a symbolic link (to {target}); cem-bench does not write or read through links inside "
            f"a results folder, which may be shared. Remove the link (or give --out a folder of your own)")


def open_dir(root: str, folders: list[str], *, create: bool) -> int:
    """A descriptor of ``root/folders...``: ``root`` as given (links followed: the user named it), each
    folder below it opened with ``O_NOFOLLOW`` (made when missing and ``create``). UnsafePath when one of
    them is a link or a file; FileNotFoundError when one is missing and not ``create``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = root
    try:
        for part in folders:
            if part in ("", os.curdir, os.pardir) or os.sep in part or "\0" in part:
                raise UnsafePath(f"{os.path.join(shown, part)}: not a plain folder name")
            shown = os.path.join(shown, part)
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ENOTDIR, errno.ELOOP):
                        raise UnsafePath(_link_message(shown, part, fd)) from e
                    raise
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise UnsafePath(_link_message(shown, part, fd)) from e
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _replace_in(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    """``name`` in the folder ``dir_fd`` becomes ``data``: a fresh temp file (never an existing one, never
    through a link) renamed over it."""
    tmp = f".{name}.tmp{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError as e:
            raise UnsafePath(f"{shown} is a folder; cem-bench writes a file there: remove or rename the folder") from e
    finally:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass


# the largest file cem-bench reads whole; a link to /dev/zero or a runaway file stops here, not in memory
READ_LIMIT = 4 << 30


def read_regular(path: str | os.PathLike, *, within: str | os.PathLike | None = None,
                 limit: int = READ_LIMIT) -> bytes:
    """The bytes of a regular file, read without hanging or flooding memory: a named pipe, a device
    (``/dev/zero``), or a file over ``limit`` bytes is refused with UnsafePath before it is read. With
    ``within``, no link is followed below that folder (the file itself included): what a shared results
    folder links to elsewhere is never read. FileNotFoundError (and other OSErrors) as they come."""
    path = os.path.abspath(_local(str(path)))
    root = os.path.dirname(path) if within is None else os.path.abspath(_local(str(within)))
    rel = os.path.relpath(path, root)
    if rel.startswith(os.pardir) or os.path.isabs(rel) or rel == os.curdir:
        raise UnsafePath(f"{path} lies outside {root}; cem-bench reads only files inside the results folder")
    *folders, name = rel.split(os.sep)
    dfd = open_dir(root, folders, create=False)
    try:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if within is not None else 0)
        try:
            fd = os.open(name, flags, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(_link_message(path, name, dfd).replace("write or read", "read")) from e
            raise
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            what = ("a named pipe" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise UnsafePath(f"{path} is {what}, not a file cem-bench wrote; cem-bench reads only regular files")
        if st.st_size > limit:
            raise UnsafePath(f"{path} holds {st.st_size:,} bytes, more than the {limit:,} cem-bench reads from one "
                             f"file; it is not a file cem-bench wrote")
        os.set_blocking(fh.fileno(), True)
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafePath(f"{path} is larger than the {limit:,} bytes cem-bench reads from one file")
    return data


def remove_file(path: str) -> None:
    """Delete a file, local or on object storage; nothing when it is missing."""
    if not is_uri(path) or path.startswith("file://"):
        try:
            os.unlink(_local(path))
        except FileNotFoundError:
            pass
        return
    fs, p = filesystem(path)
    try:
        fs.delete_file(p)
    except FileNotFoundError:
        pass


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
    """Copy a local file to a local path or a URI, atomically (``write_bytes``: never through a link)."""
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
        """The file's bytes; OSError (FileNotFoundError, IsADirectoryError, ...) as it comes; UnsafePath for a
        named pipe, a device or a file larger than ``READ_LIMIT`` (read_regular)."""
        if not self.uri:
            return read_regular(self.join(*parts))
        with self.fs.open_input_stream(self.join(*parts)) as fh:
            return fh.read()

    def read_bytes(self, *parts: str) -> bytes | None:
        try:
            return self.read_bytes_or_raise(*parts)
        except OSError:
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
