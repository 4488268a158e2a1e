"""The local primitives of every file cem-bench writes or reads, never through a link below the folder the
user named: ``open_dir`` (each folder opened with ``O_NOFOLLOW``), ``replace_in`` (a fresh temp file renamed
over the target), ``publish`` (a private folder's files copied into place), ``read_regular`` (no pipe, device
or oversized file), ``relative_inside`` (a path read from a table, kept inside its folder) and ``UnsafePath``.
Imports nothing of the project; ``storage`` builds ``write_bytes`` and ``Dir`` on them and re-exports them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat


class UnsafePath(OSError):
    """A path cem-bench will not write or read: a symbolic link inside a results folder, a named pipe, a
    device, a file too large to be one cem-bench wrote. An OSError (EPERM) whose ``strerror`` is the whole
    message, naming the path and what to do: the CLI prints it as one line and exits 2, and a reader that
    reports unreadable files (integrity.read_strict) names it like any other."""

    def __init__(self, message: str):
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return self.strerror


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(path: str | os.PathLike) -> bool:
    """``s3://…``, ``gs://…``, ``file://…``: a scheme first (RFC 3986). A local name holding ``://`` further on
    (``/tmp/odd://dir``) is a path: it was read as object storage with an empty bucket (2026-12-07 probe)."""
    return _SCHEME.match(str(path)) is not None


def is_remote(path: str | os.PathLike) -> bool:
    """Object storage: a URI other than ``file://`` (which is a folder of this machine, read and written in place)."""
    return is_uri(path) and not str(path).startswith("file://")


def local(path: str) -> str:
    """A ``file://`` URI as this machine's path (``file://localhost/x`` is ``/x``, RFC 8089); any other unchanged."""
    if not path.startswith("file://"):
        return path
    path = path[len("file://"):]
    return path[len("localhost"):] if path.startswith("localhost/") else path


def relative_inside(root: str | os.PathLike, path: str) -> str | None:
    """``path`` (relative to ``root``, or absolute) as a path relative to ``root`` when it lies inside it,
    judged on the names alone (no ``..``, nothing empty); None otherwise. A path read from a results table
    (``trial_dir``) goes through this before it is joined to anything: a table may come from anyone."""
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    root = os.path.abspath(local(str(root)))
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


def publish(stage: str | os.PathLike, root: str | os.PathLike, folders: list[str], *,
            record: str | None = None) -> str:
    """Copy every file under the private folder ``stage`` into ``root/folders...`` (created when missing),
    each through :func:`replace_in` and each folder through :func:`open_dir`: no link there is followed, a
    link in the way is refused (UnsafePath) before the first file is written. Returns the target folder.

    With ``record`` (a hidden file name), the target keeps the list of the files published there, and the files
    an earlier publish of the same record listed that this one did not write are removed (``prune``): a report
    drawn again into its folder left the galleries and tables of the earlier one beside the new page, which a
    reader of the folder took for the current results. Nothing else there is touched."""
    root = os.path.abspath(str(root))
    os.makedirs(root, exist_ok=True)
    target = os.path.join(root, *folders)
    top = open_dir(root, folders, create=True)
    written = []
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
                        replace_in(fds[rel], name, fh.read(), os.path.join(target, rel, name))
                    written.append(os.path.normpath(os.path.join(rel, name)))
        finally:
            for rel, fd in fds.items():
                if rel != os.curdir:
                    os.close(fd)
        if record is not None:
            prune(top, target, record, written)
            replace_in(top, record, "".join(f"{w}\n" for w in sorted(written)).encode(),
                       os.path.join(target, record))
    finally:
        os.close(top)
    return target


def prune(top: int, target: str, record: str, written: list[str]) -> None:
    """Remove what the earlier ``record`` in the open folder ``top`` lists and ``written`` does not, then the
    folders that leaves empty. Only names inside the folder (``relative_inside``), never through a link (the
    link itself is removed, as any file: it was a name the earlier publish wrote), never a folder; a name already
    gone is skipped. The record is written after the new files, so a publish stopped half-way keeps the earlier
    list and the next one prunes it."""
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=top)
    except OSError:
        # none (the first publish with a record, or a folder no publish wrote), or a link planted in its place
        # (ELOOP; replace_in then replaces the link itself): nothing is known to be stale
        return
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return   # a pipe or a folder in its place: never read (a pipe would block)
            earlier = fh.read(1 << 20).decode("utf-8", "replace").splitlines()
    except OSError:
        return
    keep = set(written)
    for line in earlier:
        rel = relative_inside(target, line.strip())
        if rel is None or rel in keep or rel == record:
            continue
        *folders, name = rel.split(os.sep)
        try:
            dfd = open_dir(target, folders, create=False)
        except (FileNotFoundError, UnsafePath):
            continue   # its folder is gone, or is now a link: nothing of ours to remove through it
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                continue
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)
        for depth in range(len(folders), 0, -1):   # galleries/ left empty goes too; a folder with anything stays
            try:
                parent = open_dir(target, folders[:depth - 1], create=False)
            except (FileNotFoundError, UnsafePath):
                break
            try:
                os.rmdir(folders[depth - 1], dir_fd=parent)
            except OSError:
                break
            finally:
                os.close(parent)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_message(shown: str, name: str, dir_fd: int) -> str:
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return f"{shown} is not a folder"
    return (f"{shown} is a symbolic link (to {target}); cem-bench does not write or read through links inside "
            f"a results folder, which may be shared. Remove the link (or give --out a folder of your own)")


def _reading(message: str) -> str:
    """A link refusal as a reader says it: no --out helps a reader (`table` and `attack` have none, and `report
    --out` reads the same link)."""
    return message.replace("write or read", "read").replace(
        "Remove the link (or give --out a folder of your own)",
        "Remove the link, or put the file it points to in its place")


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


def write_probe(dir_fd: int) -> None:
    """Make and remove a hidden file in the open folder ``dir_fd``: OSError where nothing can be written there.
    Tried, not asked of ``os.access``, which says yes to root on an immutable folder, a read-only mount, /proc or
    an NFS share that maps root to nobody (a run trained for hours was then lost on its first write)."""
    name = f".cem-bench-probe-{os.getpid()}-{secrets.token_hex(4)}"
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd))
    os.unlink(name, dir_fd=dir_fd)


# bytes of a target's name its temp file keeps (search/lock.py knows a starting file's temp by its whole name:
# those names are short)
TMP_STEM = 100


def replace_in(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    """``name`` in the folder ``dir_fd`` becomes ``data``: a fresh temp file (never an existing one, never
    through a link) renamed over it. The temp name keeps at most ``TMP_STEM`` bytes of ``name``: the whole name
    plus its suffix passed the file system's 255-byte limit for a name of 240 or more, and the write failed after
    the work (a measured calibration lost)."""
    stem = os.fsencode(name)[:TMP_STEM].decode(errors="ignore")
    tmp = f".{stem}.tmp{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            # on disk before the rename: renamed first, a power loss or a crashed host could leave the name holding
            # an empty or partial file (ext4, xfs), which the atomic rename is there to rule out
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError as e:
            raise UnsafePath(f"{shown} is a folder; cem-bench writes a file there: remove or rename the folder") from e
        # the rename itself, made durable; a file system that cannot sync a folder (some network ones) still has
        # the file, so that is not an error
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
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
    path = os.path.abspath(local(str(path)))
    root = os.path.dirname(path) if within is None else os.path.abspath(local(str(within)))
    rel = os.path.relpath(path, root)
    if rel.startswith(os.pardir) or os.path.isabs(rel) or rel == os.curdir:
        raise UnsafePath(f"{path} lies outside {root}; cem-bench reads only files inside the results folder")
    *folders, name = rel.split(os.sep)
    try:
        dfd = open_dir(root, folders, create=False)
    except UnsafePath as e:   # a linked folder on the way: said as a reader says it
        raise UnsafePath(_reading(str(e))) from e
    try:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if within is not None else 0)
        try:
            fd = os.open(name, flags, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(_reading(_link_message(path, name, dfd))) from e
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
