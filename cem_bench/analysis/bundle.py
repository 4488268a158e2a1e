"""The resume bundle's format: ``search/resume.py`` writes the bundle (``cem_resume_state.bin``) at each
complete experiment checkpoint and reads it for ``--resume``; ``results.ray_trials`` reads it too, when the
report builds the tables of an experiment folder. Writer and reader live here together, in a module both
``search`` and ``results`` may import (docs/architecture.md §3), so that the format is in one place.
"""

from __future__ import annotations

import json
import os

from ..parsing import loads_json
from ..schema import RESUME_STATE_FILE
from ..storage import Dir

BUNDLE_KIND = "cem-bench-resume-state"
BUNDLE_VERSION = 2   # 1: a pickle (written before 2026-11-26), read only with trust_pickle


class PickledBundle(ValueError):
    """The bundle is a version-1 pickle, which is not read unless the user says they trust it."""


def resume_bundle_bytes(session: str, written_at: str, files: dict[str, bytes]) -> bytes:
    """The bundle as JSON: each file's bytes in base64, the whole sealed by its SHA-256 (no code, only bytes)."""
    import base64

    from ..integrity import seal
    body = {"kind": BUNDLE_KIND, "version": BUNDLE_VERSION, "session": session, "written_at": written_at,
            "files": {n: base64.b64encode(b).decode("ascii") for n, b in sorted(files.items())}}
    return json.dumps(seal(body)).encode()


def read_resume_bundle(experiment_dir: str | os.PathLike, trust_pickle: bool = False) -> dict | None:
    """The search's bundle of its last complete experiment checkpoint (``cem_resume_state.bin``), as
    ``{"version", "session", "written_at", "files": {name: bytes}}``, or None when there is none.

    Raises ValueError when the file exists but is not an intact bundle (it is written atomically, so that
    means it was damaged or edited), and ``PickledBundle`` for a version-1 bundle (a pickle, which could run
    code when read) unless ``trust_pickle``."""
    import base64
    import binascii

    from ..integrity import unseal
    data = Dir(experiment_dir).read_bytes(RESUME_STATE_FILE)
    if data is None:
        return None
    if data[:1] == b"\x80":  # a pickle's PROTO opcode: the version-1 bundle
        if not trust_pickle:
            raise PickledBundle(f"{RESUME_STATE_FILE} was written by an older cem-bench as a pickle, which runs "
                                f"whatever code it holds when read; it was not read (--trust-pickled-state reads "
                                f"it: only for a file you wrote yourself)")
        import pickle
        try:
            bundle = pickle.loads(data)
            if bundle.get("format") != 1 or not bundle["files"]:
                raise ValueError("unknown format")
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{RESUME_STATE_FILE} is not a cem-bench state bundle ({type(e).__name__}: {e})") from e
        return {"version": 1, **bundle}
    try:
        body = unseal(loads_json(data))
    except (UnicodeDecodeError, ValueError):
        body = None
    if body is None or body.get("kind") != BUNDLE_KIND:
        raise ValueError(f"{RESUME_STATE_FILE} is not an intact cem-bench state bundle (damaged or edited)")
    if body.get("version") != BUNDLE_VERSION:
        raise ValueError(f"{RESUME_STATE_FILE} has version {body.get('version')!r}; this cem-bench reads version "
                         f"{BUNDLE_VERSION}")
    try:
        files = {str(n): base64.b64decode(b, validate=True) for n, b in body["files"].items()}
    except (binascii.Error, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{RESUME_STATE_FILE} is not an intact cem-bench state bundle ({e})") from e
    if not files:
        raise ValueError(f"{RESUME_STATE_FILE} holds no files")
    return {"version": BUNDLE_VERSION, "session": str(body.get("session")), "written_at": body.get("written_at"),
            "files": files}
