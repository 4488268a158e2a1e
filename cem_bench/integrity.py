"""The files cem-bench writes and later reads back: a format version in each, a SHA-256 of each in its
folder's manifest, and one clear ``ResultsError`` for anything that is not what cem-bench wrote.

Results travel: a colleague's experiment folder, a run attached to a bug report, a paper's artefacts. So
nothing here runs code from a file (no pickle: tensors load with ``torch.load(weights_only=True)``, the rest
is JSON or Parquet), and every way a file can be damaged ends in one paragraph that names the file, what is
wrong with it and what to do, before anything is written:

* missing, empty, a folder, unreadable, truncated, of another format: the parser's failure, named;
* changed after cem-bench wrote it (a flipped byte, another file's contents): the folder's manifest
  ``cem_bench_files.json`` holds the SHA-256 of each file written through :func:`write_recorded`, and a
  read through :func:`read_recorded` compares. No parser can catch a flipped digit in a float; a digest
  does. The manifest carries a digest of itself, so a damaged manifest is caught too;
* of another version: tables and checkpoints carry ``(kind, version)``; a version this code does not know
  names both versions.

Files written before the versions existed (format 1: no manifest, no version) still load, with the
structural checks only.

A manifest update is crash-safe: while a file is being replaced, both its old and its new digest are
accepted (the manifest is written first with both, then the file, then the manifest with the new one), so a
crash between any two writes leaves a folder that still verifies. Only one process writes a given folder's
manifest: the search driver the experiment folder's, ``cem-bench train`` the run folder's.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pandas as pd

from .errors import ResultsError
from .parsing import loads_json
from .storage import Dir, json_bytes, write_bytes

MANIFEST_FILE = "cem_bench_files.json"
MANIFEST_KIND = "cem-bench-files"
MANIFEST_VERSION = 1

# Parquet tables: the footer's key-value metadata holds {"table": kind, "format": TABLE_VERSION}
TABLE_META_KEY = b"cem_bench"
TABLE_VERSION = 2          # 1: written before the version existed (no metadata)
TABLE_REQUIRED = {"trials": ("trial_id", "status"), "epochs": ("trial_id", "epoch"),
                  "configs": ("config_id", "runs", "runs_ok")}

REBUILD_HINT = ("delete it and run `cem-bench report` on the experiment folder to rebuild it from the trials' "
                "own files")


def _has_trial_folders(folder: Dir | None) -> bool | None:
    """Does ``folder`` hold subfolders other than its report (a search's trial folders: what `report` rebuilds the
    tables from; which files make one is the schema's, above this module)? None when it cannot be told."""
    if folder is None:
        return None
    try:
        return any(not d.startswith(".") and d != "report" for d in folder.subdirs())
    except OSError:
        return None


def rebuild_hint(kind: str, folder: Dir | None = None) -> str:
    """How to get a damaged table back: `report` rebuilds the three tables where trials.parquet is missing and
    the trials' own folders are there (a missing epochs.parquet alone is only not drawn; configs.parquet is built
    from the trials where missing). A folder of tables alone (a copy, findings/) has nothing to rebuild from:
    2026-12-07 probe, the epochs hint said to delete trials.parquet too, the only copy of the results."""
    trials = _has_trial_folders(folder)
    if kind == "configs":
        return ("delete it: `cem-bench report` and `table` build the configurations from trials.parquet where it is "
                "missing")
    if kind == "epochs":
        if trials is False:
            return ("delete it: a missing epochs.parquet is only not drawn (the learning curves); this folder holds "
                    "no trial folders to rebuild it from, so keep trials.parquet, or restore both from where they "
                    "were copied")
        return ("delete it (a missing epochs.parquet is only not drawn); to get it back, delete trials.parquet too "
                "and run `cem-bench report` on the experiment folder, which rebuilds both from the trials' own "
                "files where the trial folders are beside them")
    if trials is False:
        return ("this folder holds no trial folders to rebuild it from (a copy of the tables alone): restore it from "
                "where it was copied")
    return REBUILD_HINT


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(obj: Any) -> bytes:
    """One byte string per JSON value (sorted keys, no spaces): what a self-digest is computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal(obj: dict) -> dict:
    """``obj`` with ``"sha256"`` of its canonical form added (see :func:`unseal`)."""
    body = {k: v for k, v in obj.items() if k != "sha256"}
    return {**body, "sha256": sha256(canonical(body))}


def unseal(obj: Any) -> dict | None:
    """The body of a sealed dict, or None when it is not one or its digest does not match."""
    if not isinstance(obj, dict) or not isinstance(obj.get("sha256"), str):
        return None
    body = {k: v for k, v in obj.items() if k != "sha256"}
    try:
        return body if sha256(canonical(body)) == obj["sha256"] else None
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------------ reading
def read_strict(folder: Dir, name: str, what: str) -> bytes | None:
    """The bytes of ``folder/name``; None when it does not exist. ResultsError when it is a folder or cannot
    be read (``what`` says what the file should be, for the message)."""
    kind = folder.kind(name)
    if kind == "missing":
        return None
    path = folder.url(name)
    if kind == "dir":
        raise ResultsError(f"{path} is a folder, not {what}")
    try:
        return folder.read_bytes_or_raise(name)
    except OSError as e:
        raise ResultsError(f"{path} cannot be read ({e.strerror or type(e).__name__}): it should be {what}") from e


def read_manifest(folder: Dir) -> dict[str, list[str]] | None:
    """``{name: [accepted sha256, ...]}`` of the folder's manifest; None when it has none."""
    data = read_strict(folder, MANIFEST_FILE, "cem-bench's list of file checksums")
    if data is None:
        return None
    path = folder.url(MANIFEST_FILE)
    try:
        obj = loads_json(data)
    except (UnicodeDecodeError, ValueError):
        obj = None
    body = unseal(obj)
    if body is None or body.get("kind") != MANIFEST_KIND or not isinstance(body.get("files"), dict):
        raise ResultsError(f"{path} is damaged (it is not the checksum list cem-bench wrote, or it was changed "
                           f"since), so the files of {folder.display} cannot be verified. If you edited files "
                           f"there on purpose, delete {MANIFEST_FILE} to read them unverified")
    if body.get("version") != MANIFEST_VERSION:
        raise ResultsError(f"{path} has version {body.get('version')!r}; this cem-bench reads version "
                           f"{MANIFEST_VERSION}: use the cem-bench that wrote it")
    files = body["files"]
    if not all(isinstance(v, list) and all(isinstance(d, str) for d in v) for v in files.values()):
        raise ResultsError(f"{path} is damaged (a file's entry is not a list of checksums)")
    return files


def read_recorded(folder: Dir | str, name: str, what: str, rebuild: str | None = None) -> bytes | None:
    """The bytes of ``folder/name``, verified against the folder's manifest when it lists the file; None
    when the file does not exist. ResultsError when it cannot be read or does not match; ``rebuild`` says how
    to get the file again where it can be rebuilt (a table: ``REBUILD_HINT``)."""
    folder = folder if isinstance(folder, Dir) else Dir(folder)
    data = read_strict(folder, name, what)
    if data is None:
        return None
    files = read_manifest(folder)
    if files is not None and name in files and sha256(data) not in files[name]:
        raise ResultsError(f"{folder.url(name)} is not the file cem-bench wrote there ({len(data):,} bytes, "
                           f"SHA-256 {sha256(data)[:12]}…, which {MANIFEST_FILE} does not list): it was "
                           f"damaged or changed since. " + (f"To get it back, {rebuild}. " if rebuild else "") +
                           f"If you changed it on purpose, delete {MANIFEST_FILE} "
                           f"there to read the folder unverified (the list seals itself: an entry cannot be "
                           f"removed alone)")
    return data


def vouched(folder: Dir | str, names: tuple[str, ...]) -> bool:
    """Does the folder's manifest record every one of ``names`` (each then verified by ``read_recorded`` when
    read)? Tables written together and recorded so can be trusted to describe each other; in a folder read
    unverified (its manifest deleted, as the advice for a file changed on purpose says) they cannot."""
    folder = folder if isinstance(folder, Dir) else Dir(folder)
    files = read_manifest(folder)
    return files is not None and all(n in files for n in names)


# ------------------------------------------------------------------------------------------ writing
def _write_manifest(folder: Dir, files: dict[str, list[str]]) -> None:
    body = {"kind": MANIFEST_KIND, "version": MANIFEST_VERSION, "files": dict(sorted(files.items()))}
    write_bytes(folder.url(MANIFEST_FILE), json.dumps(seal(body), indent=1).encode())


def write_recorded(folder: Dir | str, name: str, data: bytes) -> str:
    """Write ``folder/name`` atomically and record its digest in the folder's manifest (crash-safe: see the
    module docstring). A damaged manifest is not silently replaced: its ResultsError stops the write.
    Returns the file's path or URI."""
    folder = folder if isinstance(folder, Dir) else Dir(folder)
    files = read_manifest(folder) or {}
    new = sha256(data)
    # every digest still accepted stays so until the write is done: after two interrupted rewrites (a full
    # disk that has room for the list but not the table) the file on disk is the first's, which keeping only
    # the last listed digest refused
    old = [d for d in files.get(name, []) if d != new]
    _write_manifest(folder, {**files, name: old + [new]})
    write_bytes(folder.url(name), data)
    _write_manifest(folder, {**files, name: [new]})
    return folder.url(name)


def write_recorded_json(folder: Dir | str, name: str, obj: Any) -> str:
    return write_recorded(folder, name, json_bytes(obj))


# ------------------------------------------------------------------------------------------ Parquet tables
def table_bytes(df: pd.DataFrame, kind: str) -> bytes:
    """``df`` as Parquet bytes with ``{"table": kind, "format": TABLE_VERSION}`` in the footer and a CRC per
    data page (which readers of any Parquet library verify when asked)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[TABLE_META_KEY] = json.dumps({"table": kind, "format": TABLE_VERSION}).encode()
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), buf, write_page_checksum=True)
    return buf.getvalue()


def write_table(folder: Dir | str, name: str, df: pd.DataFrame, kind: str) -> str:
    return write_recorded(folder, name, table_bytes(df, kind))


def parse_table(data: bytes, path: str, kind: str, folder: Dir | None = None) -> pd.DataFrame:
    """The DataFrame of Parquet ``data`` read from ``path``, checked to be cem-bench's ``kind`` table.
    ResultsError (one paragraph, naming the file and, where ``folder`` is given, how it can be had back there)
    when it is not."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    what = f"the {kind} table"
    hint = rebuild_hint(kind, folder)
    if not data:
        raise ResultsError(f"{path} is empty (0 bytes): it should be {what} (Parquet); {hint}")
    try:
        table = pq.read_table(io.BytesIO(data), page_checksum_verification=True)
        meta = table.schema.metadata or {}
        info = meta.get(TABLE_META_KEY)
        df = table.to_pandas()
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError, OverflowError) as e:
        msg = " ".join(str(e).split())[:300]
        raise ResultsError(f"{path} is not a readable Parquet table ({type(e).__name__}: {msg}): it should be "
                           f"{what}, written by cem-bench; it is truncated, damaged or of another format. "
                           f"{hint[0].upper()}{hint[1:]}") from e
    if info is not None:
        try:
            info = loads_json(info)
            other, version = info["table"], info["format"]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
            raise ResultsError(f"{path}: its cem-bench metadata is damaged; {hint}") from e
        if other != kind:
            raise ResultsError(f"{path} holds the {other} table, not {what}: a file was copied over another; "
                               f"{hint}")
        if version != TABLE_VERSION:
            newer = isinstance(version, int) and version > TABLE_VERSION
            raise ResultsError(f"{path} is {what} in format {version!r}; this cem-bench reads format "
                               f"{TABLE_VERSION} (and format 1, from before formats were versioned): "
                               + ("upgrade cem-bench to read it" if newer else hint))
    # format 1 too (no metadata: an older cem-bench's, or one rewritten by pandas, which drops it): every
    # table cem-bench ever wrote has these, and without them the readers' own words misled (a trials table
    # without `status` was "no trials.parquet" to replay; 2026-12-07 probe)
    missing = [c for c in TABLE_REQUIRED.get(kind, ()) if c not in df.columns]
    if missing and (info is not None or len(df)):   # an empty older table has nothing to misread
        raise ResultsError(f"{path} lacks the column(s) {', '.join(missing)} of {what}; {hint}")
    return df


def read_table(folder: Dir | str, name: str, kind: str) -> pd.DataFrame | None:
    """``folder/name`` verified (manifest) and parsed (:func:`parse_table`); None when it does not exist."""
    folder = folder if isinstance(folder, Dir) else Dir(folder)
    data = read_recorded(folder, name, f"the {kind} table (Parquet)", rebuild=rebuild_hint(kind, folder))
    return None if data is None else parse_table(data, folder.url(name), kind, folder)


def listed_but_missing(folder: Dir | str, name: str) -> bool:
    """Does the folder's manifest list ``name`` though the file is gone (deleted, or left out of a copy)? What a
    file that cannot be rebuilt (search_space.json) must not be read as: missing, any value would pass."""
    folder = folder if isinstance(folder, Dir) else Dir(folder)
    files = read_manifest(folder)
    return files is not None and name in files and folder.kind(name) == "missing"


def read_json_file(folder: Dir | str, name: str, what: str, lost: str | None = None) -> Any | None:
    """A JSON file of cem-bench's, verified (manifest) and parsed; None when it does not exist. With ``lost``
    (what reading on without it would lose), a file the manifest lists but that is gone is a ResultsError: a
    copy that left out search_space.json was reported without its hypotheses and objectives, and said
    nothing (2026-12-07 probe). A table the manifest lists and lacks is read as missing instead: the tables
    are rebuilt from the trials, and a crash between the list and the file leaves a first table so."""
    folder = folder if isinstance(folder, Dir) else Dir(folder)
    data = read_recorded(folder, name, what)
    if data is None:
        if lost is not None and listed_but_missing(folder, name):
            raise ResultsError(f"{folder.url(name)} is missing, though the folder's {MANIFEST_FILE} lists it "
                               f"(an incomplete copy, or a file deleted since): read without it, {lost}. "
                               f"Restore the file from the experiment it came from; to read the folder "
                               f"without it anyway, delete {MANIFEST_FILE} there (the folder is then read "
                               f"unverified)")
        return None
    try:
        return loads_json(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise ResultsError(f"{folder.url(name)} is not valid JSON ({type(e).__name__}: {e}): it should be "
                           f"{what}; it is truncated, damaged or of another format") from e
