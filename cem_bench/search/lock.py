"""One driver per experiment folder: a new search claims its folder by creating it, and every driver (new or
``--resume``) holds an exclusive lock on a file in it until its tables are written.

Two ``cem-bench search`` commands with the same ``--storage`` and ``--name`` used to both run: the "already
exists" check came long before Ray made the folder, so both passed it, both trained, and the second's
tables replaced the first's (trials dropped, one Optuna journal holding both searches). Now:

* a new search makes its folder with one ``mkdir``: atomic on a local or network file system, so of two
  racing drivers exactly one makes it and the other is told the folder exists, before Ray starts;
* the driver then holds ``flock(LOCK_EX)`` on :data:`LOCK_FILE` inside it, and a ``--resume`` of the same
  folder takes the same lock without waiting: while one driver runs, another is refused with the holder's
  pid, host and start time. The kernel drops the lock when the process ends however it ends, so a killed
  driver never leaves a stale lock behind (NFSv4 and Lustre carry ``flock`` between hosts; a file system
  without it gets the atomic ``mkdir`` only);
* a new search that fails before Ray wrote anything resumable (no experiment state, no resume bundle, no trial
  folder: ``tuner.pkl`` alone restores nothing) removes the folder it made, so the same command can simply be
  run again; one killed then (a plain ``kill`` during Ray's start-up) cannot, and the next new search takes
  over a folder holding only what such a start leaves (the lock, the space and its checksum list, Ray's
  ``tuner.pkl``) once no driver holds its lock.

On object storage (``s3://``, ``gs://``) there is no atomic create in pyarrow's file systems and no lock:
a new search writes a claim with a random token, waits, and reads it back; of two drivers that started
within that wait, the one whose token was overwritten stops. That narrows the race to the store's
write-after-write window; it does not close it (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterator

from ..errors import SearchError
from ..integrity import MANIFEST_FILE
from ..schema import DRIVER_LOCK_FILE, INTERRUPTED_FILE, JOURNAL_FILE, SPACE_FILE
from ..storage import Dir, exists, holder_text, is_remote, join, lock_holder, write_bytes
from ..storage import local as local_path

LOCK_FILE = DRIVER_LOCK_FILE
CLAIM_FILE = ".cem-bench-driver.json"   # object storage: the claim read back after CLAIM_WAIT_S
CLAIM_WAIT_S = 2.0
LOCK_TRIES, LOCK_RETRY_S = 5, 0.05   # a lock held by a reader's probe is let go within microseconds

_HELD: set[str] = set()   # experiment folders this process holds (search_command, then run_search inside it)


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return holder_text(json.loads(os.read(fd, 4096).decode() or "{}"))
    except (OSError, ValueError):
        return ""


def _busy(exp_path: str, who: str) -> SearchError:
    return SearchError(f"another cem-bench search is running on {exp_path}{who}; wait for it to end (or stop "
                       f"it) and then continue with --resume, or start a new experiment with --name NEW_NAME "
                       f"(nothing was changed)")


def _exists(exp_path: str) -> SearchError:
    return SearchError(f"the experiment folder {exp_path} already exists; continue it with --resume or start a new "
                       f"experiment with --name NEW_NAME (nothing was changed)")


def check_available(exp_path: str, resume: bool) -> None:
    """What ``experiment_lock`` would refuse, found without making, claiming or locking anything (``search
    --dry-run``): a new search's folder that exists (unless only an abandoned start is there), a resumed one that
    another driver holds. A folder --resume cannot continue is ``check_resumable``'s to say."""
    key = str(exp_path)
    remote = is_remote(key)
    local = local_path(key)
    if not resume:
        if exists(key) and not (_abandoned_remote(key) if remote else _abandoned(local)):
            raise _exists(key)
    elif not remote:
        holder = lock_holder(os.path.join(local, LOCK_FILE))
        if holder is not None:
            raise _busy(key, holder_text(holder))


def _lock_exclusive(fd: int) -> None:
    """``flock(LOCK_EX | LOCK_NB)`` on ``fd``, tried ``LOCK_TRIES`` times ``LOCK_RETRY_S`` apart: `cem-bench report`
    and `table` hold a shared lock for an instant to see whether a search runs (storage.lock_holder), a driver holds
    it for hours. BlockingIOError when it is still held; another OSError when there is no flock here."""
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == LOCK_TRIES - 1:
                raise
            time.sleep(LOCK_RETRY_S)


def _lock_local(exp_path: str) -> int:
    """The descriptor holding the folder's lock; SearchError when another process holds it."""
    try:
        fd = os.open(os.path.join(exp_path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SearchError(f"{os.path.join(exp_path, LOCK_FILE)} is a symbolic link; cem-bench does not follow "
                              f"links inside an experiment folder: remove it") from e
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):   # a pipe or a device planted there: ftruncate's bare EINVAL
        os.close(fd)
        raise SearchError(f"{os.path.join(exp_path, LOCK_FILE)} is not a regular file (a named pipe or a device); "
                          f"cem-bench keeps its driver lock there: remove it")
    try:
        _lock_exclusive(fd)
    except BlockingIOError:
        who = _holder(fd)
        os.close(fd)
        raise _busy(exp_path, who) from None
    except OSError as e:   # no flock on this file system: the atomic mkdir still guards new searches
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
    return fd


def _claim_token(exp_path: str) -> str | None:
    data = Dir(exp_path).read_bytes(CLAIM_FILE) or b"{}"
    try:
        return json.loads(data.decode()).get("token")
    except (ValueError, AttributeError):
        return None


def _claim_remote(exp_path: str) -> None:
    token = secrets.token_hex(16)
    path = join(exp_path, CLAIM_FILE)
    write_bytes(path, json.dumps({"token": token, "host": socket.gethostname(), "pid": os.getpid()}).encode())
    try:
        time.sleep(CLAIM_WAIT_S)
        if _claim_token(exp_path) == token:
            return
    except BaseException:
        # stopped while claiming (Ctrl-C, ``ray job stop``'s SIGTERM): a claim left behind made the name
        # unusable, "already exists" for a new search and "no experiment" for --resume; it goes, if still ours
        with contextlib.suppress(Exception):
            if _claim_token(exp_path) == token:
                _remove(exp_path)
        raise
    raise _busy(exp_path, "")


def _remove(path: str) -> None:
    if is_remote(path):
        from ..storage import filesystem
        fs, p = filesystem(path)
        with contextlib.suppress(OSError):
            fs.delete_dir(p)
        return
    shutil.rmtree(local_path(path), ignore_errors=True)


# What a new search writes into its folder before Ray writes anything resumable (its first experiment state, the
# resume bundle, a trial folder): a folder holding no more than these (and the temporary files of their atomic
# writes) was left by a driver stopped while it started (search/run.py: _tuner): the lock, the space and its
# checksum list, the Optuna journal the searcher creates (and the lock Optuna takes on it), the marker Ray's Tuner
# writes to check the storage, and Ray's tuner.pkl. tuner.pkl alone restores nothing (--resume refuses a folder
# without an experiment state); left out of these, a driver stopped just after writing it left a name neither a
# new search (the folder exists) nor --resume (no experiment state) could use. The interruption record is written
# just before Tune's loop starts (search/run.py), before any state too
_STARTING_FILES = frozenset({LOCK_FILE, SPACE_FILE, MANIFEST_FILE, JOURNAL_FILE, JOURNAL_FILE + ".lock",
                             ".validate_storage_marker", "tuner.pkl", INTERRUPTED_FILE})
CLAIM_STALE_S = 600.0   # object storage: a claim this old with nothing resumable beside it is a stopped start's


def _only_starting_files(names: set[str]) -> bool:
    """Do ``names`` hold nothing but what a search leaves while it starts (``_STARTING_FILES``, their temporary
    files ``.NAME.tmpPID.HEX``, the object storage claim)?"""
    def starting(n: str) -> bool:
        if n in _STARTING_FILES or n == CLAIM_FILE:
            return True
        m = re.fullmatch(r"\.(.+)\.tmp\d+\.[0-9a-f]{8}", n)
        return m is not None and (m.group(1) in _STARTING_FILES or m.group(1) == CLAIM_FILE)
    return all(starting(n) for n in names)


def only_starting_files(exp_path: str) -> bool:
    """Does the folder ``exp_path`` (local or on object storage) hold nothing but what a search leaves while it
    starts (``_only_starting_files``; no folder in it), so that nothing in it can be resumed? False when it
    cannot be listed."""
    import pyarrow.fs as pafs

    from ..storage import filesystem
    try:
        fs, root = filesystem(exp_path)
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    except OSError:
        return False
    return not any(i.type == pafs.FileType.Directory for i in infos) and \
        _only_starting_files({i.base_name for i in infos})


def _abandoned_remote(exp_path: str) -> bool:
    """An object storage folder left by a new search stopped while it started (killed during its claim or Ray's
    start): nothing in it but what such a start leaves, and its claim older than ``CLAIM_STALE_S`` (a search
    that is starting now is younger). There is no lock to ask there, so age stands in for it."""
    import pyarrow.fs as pafs
    d = Dir(exp_path)
    try:
        infos = d.fs.get_file_info(pafs.FileSelector(d.root, recursive=False))
    except OSError:
        return False
    if any(i.type == pafs.FileType.Directory for i in infos) or not _only_starting_files({i.base_name for i in infos}):
        return False
    when = d.mtime(CLAIM_FILE)
    if when is None or time.time() - when > CLAIM_STALE_S:
        return True
    raise SearchError(f"the experiment folder {exp_path} holds only the claim of a search that started "
                      f"{time.time() - when:.0f} s ago and no Ray Tune experiment yet: a search starting now, or one "
                      f"stopped while it started; if none is starting, a new search with this name takes the folder "
                      f"over once the claim is {CLAIM_STALE_S / 60:g} min old (or remove {exp_path}); or start a new "
                      f"experiment with --name NEW_NAME (nothing was changed)")


def _abandoned(local: str) -> bool:
    """A folder left by a new search stopped before Ray wrote anything resumable: no more than ``_STARTING_FILES``
    in it, and no driver holding its lock (a search that is starting holds it)."""
    try:
        names = set(os.listdir(local))
    except OSError:
        return False
    if not _only_starting_files(names) or CLAIM_FILE in names:
        return False
    if LOCK_FILE not in names:
        return False   # an empty folder is also a new search between its mkdir and its lock: never taken
    try:
        # non-blocking: a named pipe planted at the lock's name would wait for a writer forever
        fd = os.open(os.path.join(local, LOCK_FILE), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size == 0:
            return False   # made, not yet locked: a driver writes who it is once it holds the lock
        _lock_exclusive(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError:   # held (a search starting now), or no flock here: not provably abandoned
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def experiment_lock(exp_path: str, resume: bool) -> Iterator[None]:
    """Hold ``exp_path`` for this driver: made here for a new search (SearchError when it exists), locked
    for a resumed one (SearchError while another driver holds it). Re-entrant within one process."""
    key = str(exp_path)
    if key in _HELD:
        yield
        return
    made = False
    fd = None
    if is_remote(key):
        if not resume:
            if exists(key):
                if not _abandoned_remote(key):
                    raise _exists(key)
                print(f"cem-bench: {key} holds only what a search stopped while starting leaves (no Ray Tune "
                      f"experiment, its claim older than {CLAIM_STALE_S / 60:g} min): this search takes it over",
                      flush=True)
            _claim_remote(key)
            made = True
    else:
        local = local_path(key)
        if not resume:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            try:
                os.mkdir(local)
                made = True
            except FileExistsError:
                if not _abandoned(local):
                    raise _exists(local) from None
                # nothing in it can be resumed and no driver holds it: this search takes it over under the lock
                # below, as if it had made it, so that neither a new search nor --resume is stuck on it
                print(f"cem-bench: {local} holds only what a search stopped while starting leaves (no Ray Tune "
                      f"experiment): this search takes it over", flush=True)
                made = True
        elif not os.path.isdir(local):
            yield   # nothing to lock: the caller says what is missing
            return
        try:
            fd = _lock_local(local)
        except SearchError:
            raise   # another driver holds it (one that took over an abandoned folder): the folder is its
        except BaseException:
            if made:
                shutil.rmtree(local, ignore_errors=True)
            raise
    _HELD.add(key)
    try:
        yield
    except BaseException:
        # a new search that failed before Ray wrote anything resumable: the folder goes, so the same
        # command can run again (with an experiment state or a trial folder there, --resume continues it: kept)
        if made and only_starting_files(key):
            _remove(key)
        raise
    finally:
        _HELD.discard(key)
        if fd is not None:
            os.close(fd)
