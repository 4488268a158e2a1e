"""Files of results, local or on object storage (``s3://``, ``gs://``, any pyarrow.fs URI), written atomically.

One way to write: ``write_bytes`` (and ``write_json`` on top of it; ``integrity`` adds the Parquet tables and
the checksums) writes a temporary
file and renames it into place locally, and does a single PUT on object stores (which are atomic per
object), so a crash never leaves a half-written file. ``Dir`` reads a folder the same way on both.

The local primitives underneath, which never go through a link below the folder the user named (``open_dir``,
``replace_in``, ``publish``, ``read_regular``, ``relative_inside``, ``UnsafePath``), live in ``safefiles``;
the rest of the project imports them from here.
"""

from __future__ import annotations

import errno
import json
import math
import os
import time
from typing import Any

# UnsafePath, is_uri, is_remote, local, publish, relative_inside and write_probe are re-exported: the project and the
# tests import them from storage (they live in safefiles, which config may import too)
from .safefiles import (  # noqa: F401
    UnsafePath,
    is_remote,
    is_uri,
    local,
    open_dir,
    publish,
    read_regular,
    relative_inside,
    replace_in,
    write_probe,
)


def resolve_storage(storage: str | None) -> str:
    """``None`` -> ``./results`` made absolute; a URI (``s3://``, ``gs://``, ...) with its path's trailing
    slashes removed (:func:`clean_uri`: StorageUnavailable for one that names no bucket); a path, or a
    ``file://`` URI, as an absolute path."""
    storage = "results" if storage is None else str(storage)
    if is_remote(storage):
        return clean_uri(storage, "--storage ")
    # file:// too: a local folder. Handed on as a URI, pyarrow refused a relative one (file://res) and
    # localhost (file://localhost/x) once Ray had started, where the dry run had passed (2026-12-07 probe)
    return os.path.abspath(os.path.expanduser(local(clean_uri(storage, "--storage ") if is_uri(storage) else storage)))


# object stores whose URI starts with a bucket: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX
BUCKET_SCHEMES = ("s3", "gs", "gcs")


def clean_uri(uri: str, flag: str = "") -> str:
    """``uri`` with the trailing slashes of its path removed (``s3://B/p/`` -> ``s3://B/p``; a ``?query`` kept).

    :class:`StorageUnavailable` (``flag``, e.g. ``"--storage "``, starts the message) for a URI that names
    nothing: a scheme alone (``s3://``, what ``s3://$BUCKET`` gives with BUCKET unset; ``file://``), or an
    object-store URI without a bucket (``s3:///p``). Stripping such a URI's slashes left ``s3:``, a local
    folder's name: the search made ``./s3:`` and Ray then tried to create a bucket."""
    scheme, _, rest = str(uri).partition("://")
    path, q, query = rest.partition("?")
    trimmed = path.rstrip("/") or path[:1]          # file:/// is the root: it keeps its one slash
    valid = "give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a local folder"
    if scheme in BUCKET_SCHEMES and not path.split("/", 1)[0]:
        hint = f" (an unset variable in {scheme}://$BUCKET?)" if not path.strip("/") else ""
        raise StorageUnavailable(f"{flag}{uri}: not a storage cem-bench can use: no bucket named{hint}; {valid}")
    if not trimmed:
        raise StorageUnavailable(f"{flag}{uri}: not a storage cem-bench can use: a scheme alone names no "
                                 f"storage; {valid}")
    return f"{scheme}://{trimmed}{q}{query}"


def join(base: str, *parts: str) -> str:
    base = str(base)
    if is_uri(base):   # a URI's options (?endpoint_override=…&scheme=http) stay at its end, after the path
        head, q, query = base.partition("?")
        return "/".join([head.rstrip("/"), *[p.strip("/") for p in parts]]) + q + query
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
            return pafs.LocalFileSystem(), local(path)
        clean_uri(path)   # a URI with no bucket is refused here, whoever gives it
        try:
            fs, p = pafs.FileSystem.from_uri(path)
        except (ValueError, OSError) as e:  # ArrowInvalid (a ValueError): an unknown scheme, a URI with no bucket
            raise StorageUnavailable(f"{path}: not a storage cem-bench can use ({' '.join(str(e).split())}); give a "
                                     f"local folder, s3://BUCKET/PREFIX (an S3-compatible endpoint too: "
                                     f"docs/cluster.md) or gs://BUCKET/PREFIX") from e
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
    if not is_remote(path):
        path = os.path.abspath(local(path))
        root = os.path.dirname(path) if within is None else os.path.abspath(local(str(within)))
        rel = os.path.relpath(path, root)
        if rel.startswith(os.pardir) or os.path.isabs(rel) or rel == os.curdir:
            raise ValueError(f"write_bytes: {path} is not inside {root}")
        *folders, name = rel.split(os.sep)
        os.makedirs(root, exist_ok=True)
        fd = open_dir(root, folders, create=True)
        try:
            replace_in(fd, name, data, path)
        finally:
            os.close(fd)
        return
    fs, p = filesystem(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as out:
        out.write(data)



def lock_holder(path: str | os.PathLike) -> dict | None:
    """Who holds an exclusive ``flock`` on the local file ``path`` (the JSON it holds: ``pid``, ``host``,
    ``started``; ``{}`` when unreadable), or None when nobody does, or the file is missing, a link, or on a file
    system without ``flock``, or not a regular file (a named pipe there would block an open without
    ``O_NONBLOCK``). It asks with a shared lock taken and dropped at once, never waiting (a driver taking its
    own lock in that instant retries: search/lock.py)."""
    import fcntl
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.read(fd, 4096).decode() or "{}")
            except (OSError, ValueError):
                holder = {}
            return holder if isinstance(holder, dict) else {}
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def holder_text(holder: dict | None) -> str:
    """`` (pid 4242 on host, started 2026-12-06T07:00:00+0000)`` for ``lock_holder``'s record, "" when it says
    nothing usable."""
    try:
        return f" (pid {holder['pid']} on {holder['host']}, started {holder['started']})"
    except (KeyError, TypeError):
        return ""


def remove_file(path: str) -> None:
    """Delete a file, local or on object storage; nothing when it is missing."""
    if not is_remote(path):
        try:
            os.unlink(local(path))
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
    path = local(str(path))
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
        self.uri = is_remote(path)
        if self.uri:
            path = clean_uri(path)   # s3:// alone is refused (stripped, it was the local folder 's3:')
            self.fs, self.root = filesystem(path)
            self.display = path
        else:
            self.root = os.path.abspath(os.path.expanduser(local(path)))
            self.display = self.root

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts]) if self.uri else os.path.join(self.root, *parts)

    def url(self, *parts: str) -> str:
        """A path for ``write_bytes`` and friends: the local path, or the URI."""
        return join(self.display, *parts) if self.uri else self.join(*parts)

    def is_dir(self) -> bool:
        if not self.uri:
            return os.path.isdir(self.root)
        import pyarrow.fs as pafs
        return self.fs.get_file_info(self.root).type == pafs.FileType.Directory

    def subdirs(self) -> list[str]:
        if not self.uri:   # a linked folder is not one of the experiment's: what it links to is never read
            return sorted(e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False))
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
        named pipe, a device, a file larger than ``READ_LIMIT`` or a link anywhere below this folder
        (read_regular): a link planted in a shared results folder copied its target into the tables and
        the report (``read_bytes`` takes it as missing)."""
        if not self.uri:
            return read_regular(self.join(*parts), within=self.root)
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
