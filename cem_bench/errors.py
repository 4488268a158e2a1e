"""Every error type of cem-bench, in one bottom module that imports nothing of the project.

The CLI turns ``ConfigError`` (and its subclasses) and ``DataError`` into one clear message and exit code 2;
the search ends a trial that raises ``TrialDiverged``, ``ConfigError`` or ``DataError`` as an error row
without retrying it (a retry would fail the same way); a ``DataDownloadError`` (the network) is retried.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration key or value is invalid. The message names it and lists what is allowed."""


class SpaceError(ConfigError):
    """A search space is invalid. ``errors`` holds one line per problem, each naming its YAML path."""

    def __init__(self, errors: list[str] | str, path: str | None = None):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        self.path = path
        super().__init__("\n".join(self.errors))


class SearchError(ConfigError):
    """A search cannot start (existing experiment, nothing to resume, ...)."""


class ResultsError(ConfigError):
    """A results folder cannot be read or reported on (missing, empty, not written by cem-bench)."""


class StorageFull(RuntimeError):
    """The storage of a search or run is out of space; the message says where, how much is free and how to
    finish (``--resume``)."""


class DataError(RuntimeError):
    """A dataset cannot be loaded; the message says where the files go and how to get them."""


class DataDownloadError(OSError):
    """A data set is missing and its download failed for a reason that may pass (the network: unreachable, a
    reset, a timeout, a server error 5xx); the message says where the files go. Not in ``TRIAL_FATAL``: a
    search's trial that raises it is retried by Ray (``max_failures``) and by ``--resume``, where a
    ``DataError`` would end it for good. An ``OSError``, so that the CLI says it in one line."""

    def __init__(self, *args):
        # one argument, the message, is kept as strerror (what the CLI prints, whole); more are OSError's own
        # (errno, strerror, ...), as unpickling passes them back
        super().__init__(*((None, args[0]) if len(args) == 1 else args))

    def __str__(self) -> str:
        return str(self.strerror) if self.errno is None and self.strerror is not None else super().__str__()


class TrialDiverged(RuntimeError):
    """The classification loss became non-finite."""


# errors that end a trial at once: retrying the same configuration would fail the same way
TRIAL_FATAL = (ConfigError, DataError, TrialDiverged)
