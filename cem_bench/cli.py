"""``cem-bench train | attack | search | report | table | bench | keys``."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time

from .config import ConfigError, TrialConfig, load_yaml_config, parse_set
from .parsing import positive_int

EPILOG = "Configuration keys: `cem-bench keys` lists every key with its default and allowed values."
BENCH_GROUPS = "<bench groups>"   # in a help string: what `bench --only` accepts, filled by _BenchHelp


class _BenchHelp(argparse.HelpFormatter):
    """``bench --help``: ``BENCH_GROUPS`` becomes the names that ``run_bench(only=...)`` accepts, from the
    bench's own registry (``bench.group_names``, which its check of ``--only`` uses), so that a new row group
    is listed without an edit here. Imported only when the help is printed: the bench imports torch."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        if text and BENCH_GROUPS in text:
            from .bench import group_names
            text = text.replace(BENCH_GROUPS, " ".join(group_names()))
        return text


class ArgParser(argparse.ArgumentParser):
    """argparse, with a hint where its own error misleads: an option taking a list (``--metrics a b``) takes
    every word after it, the folder too, and argparse then says the folder is missing although it was given.
    The hint names the option that took it and the two ways out (the folder first, or ``--`` to end the list).
    Subcommands inherit the class (``add_subparsers`` uses the parent's)."""

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        self._refuse_repeats(self._argv)
        return super().parse_known_args(args, namespace)

    def _refuse_repeats(self, argv: list[str]) -> None:
        """An option that keeps one value (``--config``, ``--out``, ``--threads``, ``--metrics``) given twice:
        argparse keeps the last without a word, so ``--config a.yaml --config b.yaml`` trained b's keys alone, at
        the defaults a had set (2026-12-07 probe). The options that gather (``--set``) are not counted. A
        subcommand's parser sees its own words; counting stops at ``--`` and at the subcommand's name."""
        subcommands = {name for a in self._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}
        single = {flag: a for a in self._actions if isinstance(a, argparse._StoreAction) and a.option_strings
                  for flag in a.option_strings}
        seen: dict[int, list[str]] = {}
        for word in argv:
            if word == "--" or word in subcommands:
                break
            a = single.get(word.split("=", 1)[0] if word.startswith("--") else word)
            if a is not None:
                seen.setdefault(id(a), []).append(word.split("=", 1)[0])
        for words in seen.values():
            if len(words) > 1:
                self.error(f"{' and '.join(sorted(set(words)))} given {len(words)} times; an option that keeps one "
                           f"value takes it once (argparse would keep the last without a word)")

    def error(self, message):
        if message.startswith("the following arguments are required"):
            argv = getattr(self, "_argv", None) or []
            greedy = [flag for a in self._actions if a.option_strings and a.nargs in ("+", "*")
                      for flag in a.option_strings if flag in argv]
            if greedy:
                message += (f" (if given: {greedy[0]} takes every word after it; give them before {greedy[0]}, "
                            f"or end its list with --)")
        super().error(message)


def _config_from_args(args) -> TrialConfig:
    flat = {}
    if getattr(args, "config", None):
        flat.update(load_yaml_config(args.config))
    flat.update(parse_set(args.set))
    return TrialConfig.from_flat(flat)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _progress(record: dict, final: bool, **_) -> None:
    if final:
        return
    keys = ("train_loss", "train_acc", "rob_loss", "test_acc", "test_acc_clean", "feature_spread", "epoch_s",
            "images_per_s", "tflops")
    line = " ".join(f"{k}={_fmt(record[k])}" for k in keys if k in record)
    print(f"epoch {record['epoch']:>3} {line}", flush=True)


def cmd_train(args) -> int:
    from .core import checkpoint
    from .core.trial import build_config, run_trial
    from .integrity import write_recorded_json
    from .schema import METRICS_FILE
    from .storage import is_uri, jsonable, local
    cfg = build_config(_config_from_args(args))  # validate before any work
    check_train_sets_are_read(parse_set(args.set), cfg)
    out = local(args.out or os.path.join("results", "runs", time.strftime("%Y%m%d-%H%M%S")))   # file://: a path
    if is_uri(out):   # its checks looked at the URI as a local name, and the run went to a local "s3:" folder
        raise ConfigError(f"train --out {out}: a run is written to a local folder; give one, and copy it to object "
                          f"storage afterwards (a search writes there itself: search --storage). Nothing was trained")
    # before training: a run is never trained only to be discarded or to replace another. A named folder is
    # created only once there is something to put in it (a missing dataset writes nothing); the default one is
    # claimed now (two runs started in the same second wrote into one folder, the first lost), and removed again
    # when the run ends before writing into it
    claimed = None
    if args.out:
        check_run_out(out)
    else:
        check_out_folder(out, "the run", "Nothing was trained")
        parents = missing_parents(out)
        out = claimed = claim_run_folder(out)
    # the run's own refusals before its first line (they came after it, under "output in DIR", a folder that
    # was then never written: 2026-12-07 probe), as `search` prints its plan only once its checks have passed
    from . import surrogates
    from .core.runtime import resolve_device
    from .core.step_options import graph_mode
    inactive = surrogates.never_active(cfg)
    if inactive:
        raise ConfigError(inactive)
    graph_mode(cfg, resolve_device(cfg.train.device))
    from .core.data import check_generated_sizes
    check_generated_sizes(cfg.data)
    print(f"cem-bench train: {cfg.cem.surrogate if cfg.cem.lambd > 0 else 'no CEM (lambda=0)'} on "
          f"{cfg.data.dataset}, {cfg.train.epochs} epochs, output in {out}", flush=True)
    state = {}

    def report(record, final, state_fn=None):
        _progress(record, final)
        if final and state_fn is not None:
            state["final"] = state_fn()

    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    before = set(os.listdir(out)) if os.path.isdir(out) else set()
    try:
        result = run_trial(cfg, report, out_dir=out)
        os.makedirs(out, exist_ok=True)
        ckpt = checkpoint.save_run(out, cfg.to_flat(), state.get("final"))
        metrics = write_recorded_json(out, METRICS_FILE, result)
    except BaseException:
        # a run that did not finish writing leaves nothing of itself: its gallery and checksum list without a
        # checkpoint (2026-12-07 probe: a disk that filled while saving) made `--out` refuse the same command
        # again ("already holds a run"), and `attack` found no checkpoint
        _remove_new_run_files(out, before)
        if claimed and not os.listdir(claimed):   # and results/runs/ where this run made them: nothing written
            for folder in [claimed, *parents]:
                with contextlib.suppress(OSError):   # another run's folder in it now: kept
                    os.rmdir(folder)
        raise
    summary = {k: v for k, v in result.items() if k != "info"}
    print(json.dumps(jsonable(summary), indent=2))
    gallery = (os.path.join(out, result["info"]["gallery"]) if result["info"]["gallery"] else
               f"none (attack not run: {result.get('attack_skipped') or 'no images'})")
    print(f"metrics: {metrics}\ngallery: {gallery}\ncheckpoint: {ckpt}")
    return 0


def _remove_new_run_files(out: str, before: set[str]) -> None:
    """Remove what a failed ``train`` wrote into ``out``: the run's files and the temporary files of their atomic
    writes that were not there before it started (a file of the user's, named alike, was refused or kept)."""
    from .integrity import MANIFEST_FILE
    from .schema import CHECKPOINT_FILE, GALLERY_FILE, METRICS_FILE
    try:
        names = set(os.listdir(out)) - before
    except OSError:
        return
    ours = {CHECKPOINT_FILE, GALLERY_FILE, METRICS_FILE, MANIFEST_FILE}
    for name in names:
        if name in ours or (name.startswith(".") and ".tmp" in name):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out, name))


def claim_run_folder(out: str) -> str:
    """Make ``out`` (or ``out-2``, ``out-3``, ... when another made it first) in one step and return the name
    made: the default ``results/runs/<time>`` of runs started in the same second (``for s in 1 2 3; do cem-bench
    train --set seed=$s & done``), or two re-attacks' ``attack-<time>``, are one name, and a look before the
    make let both write into one folder."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    name, k = out, 1
    while True:
        try:
            os.mkdir(name)
            return name
        except FileExistsError:
            k += 1
            name = f"{out}-{k}"


def missing_parents(path: str) -> list[str]:
    """The folders above ``path`` that do not exist yet, deepest first (what making it would create)."""
    made, head = [], os.path.dirname(os.path.abspath(path))
    while head and not os.path.lexists(head):
        made.append(head)
        head = os.path.dirname(head)
    return made


def check_run_out(out: str) -> None:
    """ConfigError when ``train --out`` cannot take a new run: a file, a path under a file, or a folder that
    already holds one (its checkpoint, metrics or gallery would be replaced without a word; a gallery name that is
    a folder, or a link to one, would stop the run after training). An empty folder is fine."""
    from .integrity import MANIFEST_FILE
    from .schema import CHECKPOINT_FILE, GALLERY_FILE, METRICS_FILE, REPORT_RECORD, SPACE_FILE, TRIALS_FILE
    check_out_folder(out, "the run", "Nothing was trained")
    held = [f for f in (CHECKPOINT_FILE, METRICS_FILE, GALLERY_FILE) if os.path.lexists(os.path.join(out, f))]
    if held and CHECKPOINT_FILE not in held and os.path.lexists(os.path.join(out, "attack.json")):
        # a re-attack's folder (attack.json, recon.png): `cem-bench attack` on it, as the message below advises
        # for a run, fails (2026-12-07 probe)
        raise ConfigError(f"--out {out} holds a re-attack's output (attack.json, {', '.join(held)}) of the run in "
                          f"{os.path.dirname(os.path.abspath(out))}; give a new or empty folder. Nothing was trained")
    if held:
        raise ConfigError(f"--out {out} already holds a run ({', '.join(held)}); give another folder, or remove "
                          f"that one first (`cem-bench attack {out}` re-attacks the run in it). Nothing was trained")
    # a search's experiment or another cem-bench folder: the run's files would join its checksum list (2026-12-07
    # probe: `train --out EXP` recorded checkpoint.pt and metrics.json in a live experiment's manifest)
    # a report's folder too: the run's files joined the page's, and the next report rewrote the folder around them
    other = [f for f in (MANIFEST_FILE, TRIALS_FILE, SPACE_FILE, "tuner.pkl", REPORT_RECORD)
             if os.path.lexists(os.path.join(out, f))]
    if other:
        raise ConfigError(f"--out {out} holds cem-bench results of another kind ({', '.join(other)}): a run is a "
                          f"folder of its own; give a new or empty one. Nothing was trained")


def check_report_out(out: str, named: str | None = None) -> None:
    """ConfigError when ``report --out DIR`` names a folder holding anything but an earlier report: its files of
    the report's names (index.html, configs.csv, the figures) would be replaced without a word (2026-12-07 probe:
    a site's own index.html; the results folder itself; a trial's folder; ``/``, where 14 files were written).
    Missing, empty, or an earlier report (its index.html is a cem-bench report page; or only the ``source/`` an
    earlier report of object storage fetched before it stopped) is fine. ``named``: how the message names the
    folder (``--out DIR`` by default; the default ``RESULTS/report`` is checked the same way)."""
    named = named or f"--out {out}"
    try:
        names = sorted(n for n in os.listdir(out) if not n.startswith("."))
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"{named} cannot be listed ({e.strerror}); give another folder. Nothing was written") from e
    if not names or names == ["source"]:   # source/: what an earlier report of object storage fetched first
        return
    try:
        with open(os.path.join(out, "index.html"), "rb") as fh:
            if b"<title>cem-bench report:" in fh.read(4096):
                return
    except OSError:
        pass
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise ConfigError(f"{named} holds files that are not a cem-bench report ({shown}): the report's own "
                      f"(index.html, configs.csv, the figures and galleries) would replace any of the same names. "
                      f"Give a new or empty folder, or one an earlier report was written to. Nothing was written")


def check_out_folder(out: str, what: str, nothing: str) -> None:
    """``--out DIR``: ConfigError before any work when ``out`` is a file or cannot be made
    (``check_writable_under``); a missing folder is created later, by the command."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out} is a file, not a folder; give a folder for {what} (it is created when "
                          f"missing). {nothing}")
    if os.path.isdir(out):   # the folder itself takes the writes: its parent's rights say nothing of it
        check_can_write("--out", out, out, nothing)
    else:
        check_writable_under("--out", out, nothing)
    check_makeable("--out", out, nothing)


def check_makeable(flag: str, folder: str, nothing: str) -> None:
    """ConfigError, before any work, when the folder cannot be made (a name too long for the file system, a
    path under /proc): made and removed again, so that what a command writes only where it wrote something
    (a missing data set leaves no empty folder) still holds. URIs and existing paths pass."""
    from .storage import is_uri
    if is_uri(folder) or os.path.lexists(folder):   # an existing file has its own message, where it is checked
        return
    made, head = [], os.path.abspath(folder)
    while not os.path.lexists(head):
        made.append(head)
        head = os.path.dirname(head)
    try:
        os.makedirs(folder)
    except OSError as e:
        raise ConfigError(f"{flag} {folder}: the folder cannot be made ({e.strerror or e}). {nothing}") from None
    finally:
        for path in made:   # deepest first; only what this check made, as far as it got
            if os.path.isdir(path):
                os.rmdir(path)


def check_writable_under(flag: str, path: str, nothing: str) -> None:
    """ConfigError, before any work, when ``path`` cannot be made: its nearest existing parent is a file, or a
    folder this user cannot write (the write at the end failed with a bare OS message after the work)."""
    from .storage import is_uri, nearest_existing
    if is_uri(path):
        return
    base = nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(base):
        raise ConfigError(f"{flag} {path}: {base} is a file, so nothing can be written under it; give a path in a "
                          f"folder. {nothing}")
    check_can_write(flag, path, base, nothing)


def check_can_write(flag: str, path: str, folder: str, nothing: str) -> None:
    """ConfigError, before any work, when a file cannot be made in the existing ``folder`` (``write_probe``: the
    write after hours of training failed with a bare OS message)."""
    from .storage import write_probe
    fd = None
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        write_probe(fd)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: nothing can be written in the folder {folder} ({e.strerror or e}: "
                          f"not writable by this user, or a read-only or special file system); give a folder "
                          f"you can write. {nothing}") from None
    finally:
        if fd is not None:
            os.close(fd)


def _json_with(*keys: str):
    """Is a file's text a JSON object with these top-level keys (what a command's ``--json`` writes)?"""
    def test(data: bytes) -> bool:
        try:
            obj = json.loads(data)
        except ValueError:
            return False
        return isinstance(obj, dict) and set(keys) <= set(obj)
    return test


# What each command's --json / --yaml writes, told from the file's text: an existing file that is none of these is
# not replaced (2026-12-07 probe: `calibrate --json EXP/trials.parquet --yaml SPACE.yaml` replaced a sealed results
# table and a search space without a word)
EARLIER_OUTPUT = {
    ("calibrate", "--json"): _json_with("configuration", "records"),
    ("calibrate", "--yaml"): lambda data: data.startswith(b"# cem-bench calibrate:"),
    ("bench", "--json"): _json_with("header", "rows"),
}


def check_out_file(flag: str, path: str | None, nothing: str, command: str | None = None) -> None:
    """``--json FILE`` / ``--yaml FILE``: ConfigError before any work when ``path`` is a folder or cannot be
    made (``check_writable_under``). An existing file is replaced only where it is an earlier output of the same
    ``command`` and flag (``EARLIER_OUTPUT``), and never one a cem-bench folder's manifest records."""
    if not path:
        return
    if path == "-":   # the usual name of stdout: it wrote a file named "-" in the current folder (2026-12-07 probe)
        raise ConfigError(f"{flag} -: a file is written, not stdout, and its results are printed there anyway; give a "
                          f"file name (e.g. out{'.yaml' if flag == '--yaml' else '.json'}). {nothing}")
    if path.endswith(("/", os.sep)) and not os.path.isdir(path):
        # "x.json/" names a folder to a shell and a user; the write, through abspath, made the file x.json
        raise ConfigError(f"{flag} {path} ends in '/', which names a folder; give a file name (e.g. "
                          f"{path.rstrip('/' + os.sep)}). {nothing}")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a folder; give a file name (e.g. {os.path.join(path, 'out')}"
                          f"{'.yaml' if flag == '--yaml' else '.json'}). {nothing}")
    if os.path.lexists(path):
        from .integrity import MANIFEST_FILE
        folder, name = os.path.split(os.path.abspath(path))
        earlier = EARLIER_OUTPUT.get((command, flag))
        what = None
        if name == MANIFEST_FILE:
            what = "cem-bench's checksum list of its folder"
        else:
            from .errors import ResultsError
            from .integrity import read_manifest
            from .storage import Dir
            try:
                if name in (read_manifest(Dir(folder)) or {}):
                    what = f"a file of the cem-bench results that {MANIFEST_FILE} beside it records"
            except ResultsError:   # a damaged list: it vouches for nothing, and the file is judged as any other
                pass
        if what is None and earlier is not None:
            try:
                if not os.path.isfile(path) or os.path.getsize(path) > (64 << 20):
                    raise OSError("not a regular file of an earlier output's size")
                with open(path, "rb") as fh:
                    ours = earlier(fh.read())
            except OSError:
                ours = False
            if not ours:
                what = f"not an earlier output of `cem-bench {command} {flag}`"
        if what is not None:
            raise ConfigError(f"{flag} {path} exists and is {what}: it would be replaced. Give a new file name, or "
                              f"move the file away first. {nothing}")
    check_writable_under(flag, path, nothing)
    check_makeable(flag, os.path.dirname(os.path.abspath(path)), nothing)
    check_name_length(flag, path, nothing)


def check_name_length(flag: str, path: str, nothing: str) -> None:
    """ConfigError, before any work, when the file name of ``path`` is longer than its file system takes
    (``NAME_MAX``, 255 bytes on most): the checks above make and remove its folder, never the file itself, so a
    300-character name passed them and the write failed after the measurement."""
    from .storage import is_uri, nearest_existing
    if is_uri(path):
        return
    base = nearest_existing(os.path.dirname(os.path.abspath(path)))
    try:
        limit = os.pathconf(base, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    size = len(os.fsencode(os.path.basename(path)))
    if limit > 0 and size > limit:
        raise ConfigError(f"{flag} {path}: the file name is {size} bytes, and the file system there takes names of "
                          f"at most {limit}; give a shorter name. {nothing}")


def _path(text: str) -> str:
    """argparse type of every file or folder option: not empty (an unset shell variable, ``--out "$DIR"``,
    would have meant the current folder: a report written over its files), and ``~`` expanded here, once. The
    shell leaves ``--out=~/x`` and a quoted ``'~/x'`` alone; the checks before the work then looked at a folder
    ``./~/x`` while the writes, which expand it, went to ``$HOME/x`` (a saved run replaced without a word)."""
    from .storage import is_uri
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset variable?); give a folder or file name")
    return text if is_uri(text) else os.path.expanduser(text)


def _threads(text: str) -> int:
    """argparse type of ``--threads``: a whole number from 1 to this machine's cores (99999 ended in a
    traceback from a library mapping a buffer per thread)."""
    n, cores = positive_int(text), os.cpu_count() or 1
    if n > cores:
        raise argparse.ArgumentTypeError(f"{n} threads, but this machine has {cores} cores; give 1 to {cores}")
    return n


# the keys `attack --set` takes besides attack.*: none changes the split or the encoder (data.root: where the
# run's data set is on this machine, when the run recorded another machine's folder)
ATTACK_ALSO = ("train.device", "train.eval_batch_size", "data.root")
def check_train_sets_are_read(overrides: dict, cfg) -> None:
    """ConfigError, before any work, for a ``train --set`` key the run never reads (``keyref.unread_keys``:
    another surrogate's key at λ > 0, a key of an attack ``attack.names`` leaves out, ...). A ``--config`` file is
    not checked: a saved run's config with another ``--set cem.surrogate`` is a fair start, its other keys left
    unread. At λ = 0 no surrogate runs, and the same keys with ``cem.lambd=0`` are the baseline of that
    configuration."""
    from .keyref import unread_keys
    problems = [why for why, _ in unread_keys(overrides, cfg).values()]
    if problems:
        raise ConfigError(f"train --set: {'; '.join(problems)}: the run would take the value and change nothing. "
                          f"Drop the key, or choose the surrogate or attack that reads it. Nothing was trained")


def cmd_attack(args) -> int:
    from . import attacks
    from .core import checkpoint, data
    from .core.runtime import resolve_device
    from .core.trial import build, build_config
    from .errors import ResultsError
    from .storage import json_bytes, write_bytes
    overrides = parse_set(args.set)
    bad = [k for k in overrides if not (k.startswith("attack.") or k in ATTACK_ALSO)]
    if bad:
        raise ConfigError(f"cem-bench attack only changes attack.* keys (and {', '.join(ATTACK_ALSO)}); got "
                          f"{', '.join(bad)}")
    from .storage import is_remote
    if is_remote(args.run_dir):
        # the attack folder is written beside the run with os.makedirs, which would make a local folder named
        # after the URI ("s3:/bucket/...") instead of writing to the bucket
        raise ResultsError(f"{args.run_dir}: cem-bench attack reads and writes a local folder; copy the run or "
                           f"trial folder down first (for example `aws s3 sync {args.run_dir} ./run`) and attack "
                           f"that copy")
    # weights only (no pickled code; a train run's verified against its checksums): ResultsError before any work
    config, state, source = checkpoint.load_attackable(args.run_dir)
    try:
        build_config(config)
    except ConfigError as e:
        raise ResultsError(f"{source}: its config is not valid for this "
                           f"cem-bench ({' '.join(str(e).split())})") from e
    cfg = build_config({**config, **overrides})
    from .keyref import unread_keys
    unread = list(unread_keys(overrides, cfg, reattack=True).values())
    if unread:
        raise ConfigError(f"cem-bench attack: {'; '.join(why for why, _ in unread)}: the key would change nothing "
                          f"here. Leave it out{', or add its attack to attack.names' if any(a for _, a in unread) else ''}"
                          f". Nothing was attacked")
    import torch
    broken = [k for k, v in state["client"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:   # every feature would be NaN: the attack would measure nothing and report all-null metrics
        raise ResultsError(f"{source}: its encoder holds NaN or infinite "
                           f"weights ({', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}): the run "
                           f"diverged, and there is nothing to attack. Train it again (a lower train.lr, or "
                           f"train.amp off)")
    # the attack folder is made beside the run after the attack: a folder this user cannot write is refused now,
    # not after the attack's minutes (hours on CIFAR)
    check_writable_under("RUN_DIR", os.path.join(args.run_dir, "attack-"), "Nothing was attacked")
    device = resolve_device(cfg.train.device)
    splits, trainer = build(cfg, device)          # the same data and models as the trial
    checkpoint.check_same_data(args.run_dir, data.fingerprints(splits), cfg.data.root)   # the run's images?
    try:
        trainer.client.load_state_dict(state["client"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise ResultsError(f"{source}: its encoder does not fit the model "
                           f"its config builds ({type(e).__name__}: {' '.join(str(e).split())[:300]})") from e
    # the run's own torch threads unless told: on the CPU the thread count changes the order of float sums, so
    # a re-attack at another count gives other (close) SSIMs than the trial recorded
    own = checkpoint.recorded_threads(args.run_dir)
    threads = args.threads or own
    if threads:
        torch.set_num_threads(threads)
    why = "--threads" if args.threads else "the run's own" if own else "torch's default: the run records none"
    print(f"cem-bench attack: {torch.get_num_threads()} torch thread(s) ({why})", flush=True)
    res = attacks.run_all(cfg, trainer.client, splits, cfg.defense.noise_std, device)
    # two re-attacks in one second: never over an earlier one, nor into one folder
    out = claim_run_folder(os.path.join(args.run_dir, "attack-" + time.strftime("%Y%m%d-%H%M%S")))
    # within the run folder the user named: the new attack-* folder below it is not trusted (a link swapped in for
    # it after makedirs is refused, not followed)
    metrics = {**res.metrics(), "attack_s": res.seconds, "torch_threads": torch.get_num_threads()}
    # what ran it, as a trial records it: bf16 autocast on a GPU is another attack than fp32 on the CPU, and the
    # config's train.device may only say "auto"
    from . import __version__
    from .provenance import run_info
    info = run_info(device, __version__)
    try:
        res.save_gallery(os.path.join(out, "recon.png"), within=args.run_dir)
        write_bytes(os.path.join(out, "attack.json"), json_bytes({**metrics, "config": cfg.to_flat(), "info": info,
                                                                  "history": res.history()}), within=args.run_dir)
    except BaseException:   # a re-attack that could not write (a full disk) leaves no half folder of itself
        shutil.rmtree(out, ignore_errors=True)
        raise
    print(json.dumps(metrics, indent=2))
    print(f"attack results: {out} (recon.png: the originals, then a row per attack: {', '.join(cfg.attack.names)})")
    return 0


def cmd_calibrate(args) -> int:
    from . import calibrate
    from .storage import write_bytes, write_json
    calibrate.check_files(args.config, args.json, args.yaml)
    flat = {}
    if args.config:
        flat.update(load_yaml_config(args.config))
    sets = parse_set(args.set)
    flat.update(sets)
    if args.seeds and "seed" in sets:   # a --config's seed (a saved run's) gives way to --seeds
        # --seeds replaced it without a word, and the --json file's keys left it out (2026-12-07 probe)
        raise ConfigError(f"--set seed={sets['seed']} beside --seeds {' '.join(map(str, args.seeds))}: --seeds "
                          f"gives every seed measured; put this one there. Nothing was measured")
    twice = sorted({s for s in args.seeds or [] if args.seeds.count(s) > 1})
    if twice:   # one reference state per seed: a repeat is the same measurement counted twice in the medians
        raise ConfigError(f"--seeds: {', '.join(map(str, twice))} given more than once; give distinct seeds, one "
                          f"reference state each. Nothing was measured")
    warmups = args.warmup if isinstance(args.warmup, list) else []
    twice = sorted({w for w in warmups if warmups.count(w) > 1})
    if twice:   # each warm-up is one measurement: a repeat would be collapsed, not measured twice
        raise ConfigError(f"--warmup: {', '.join(map(str, twice))} given more than once; give each warm-up once. "
                          f"Nothing was measured")
    check_out_file("--json", args.json, "Nothing was measured", "calibrate")
    check_out_file("--yaml", args.yaml, "Nothing was measured", "calibrate")
    surrogates = args.surrogates or None
    # every seed's configuration, the warm-ups and the batches are checked here, before the first reference run
    plans = calibrate.plan(flat, surrogates, args.warmup, args.batches, seeds=args.seeds)
    print("cem-bench calibrate: " + "\n  ".join(calibrate.describe(plans)), flush=True)
    t0 = time.perf_counter()
    records = calibrate.table(calibrate.measure(flat, surrogates, args.warmup, args.batches, seeds=args.seeds))
    print(calibrate.format_table(records))
    print(f"({time.perf_counter() - t0:.1f} s) own: the surrogate's cem.warmup_epochs (where a trial of it matches). "
          f"λ means: cem.strength of a trial of this configuration (matched: "
          f"its loss scale measured on its own encoder at its first CEM epoch, the attention surrogates' default; "
          f"fixed: cem.loss_scale); ÷ gmm: its strength over gmm's as that trial applies it (matched: on held-out "
          f"batches). The fixed loss_scale: strength/λ = ‖∂(CEM term)/∂z‖ ÷ ‖∂CE/∂z‖ per unit λ, its ratio to gmm, "
          f"the λ with gmm's strength at λ = 16, the batch spread. matched ÷ gmm, scale: the match at this state; "
          f"drift: the ratio here of the scale matched at the surrogate's first warm-up measured (with one warm-up "
          f"a surrogate, as by default, it is its matched ÷ gmm: it tells a drift only with several --warmup)")
    measured = None
    if args.json or args.yaml:   # what was measured, with the provenance every trial result records
        import torch

        from . import __version__
        from .core.runtime import resolve_device
        from .provenance import now_iso, run_info
        measured = calibrate.measured_config(plans, {
            **run_info(resolve_device(plans[0].run_cfg.train.device), __version__), "time": now_iso(),
            "torch_threads": torch.get_num_threads()})
    if args.json:
        write_json(args.json, {"configuration": measured, "records": records})
        print(f"json: {args.json}")
    if args.yaml:
        write_bytes(args.yaml, calibrate.yaml_fragment(records, measured).encode())
        print(f"yaml: {args.yaml} (one entry per surrogate: cem.surrogate, cem.strength, cem.loss_scale, "
              f"cem.warmup_epochs; use one entry, not the whole file)")
    return 0


def cmd_keys(args) -> int:
    from . import keyref
    # an empty name (an unset variable: --surrogate "$S") is an unknown one, not no filter (it listed every key)
    plugins = {k: v for k, v in (("surrogate", args.surrogate), ("attack", args.attack)) if v is not None}
    ref = keyref.select(keyref.reference(), args.pattern, plugins, args.dataset)
    if args.json:
        print(json.dumps(keyref.to_json(ref), indent=1))
    else:
        print("\n".join(keyref.text_lines(ref)))
    return 0


def cmd_search(args) -> int:
    """The search, then the report from its tables: the two stages stay apart (a failed report loses
    nothing; `cem-bench report` rebuilds it)."""
    from .search import search_command
    from .storage import is_remote, is_uri, local, resolve_storage
    resolve_storage(args.storage)   # a URI with no bucket (s3://$BUCKET, BUCKET unset): one line, before anything
    if args.storage:
        if not is_uri(args.storage) and os.path.isdir(args.storage):
            check_can_write("--storage", args.storage, args.storage, "Nothing was run")
        check_makeable("--storage", args.storage, "Nothing was run")
    done = search_command(args)
    if done.get("dry_run"):
        return 0
    exp, stats = done["experiment"], done["stats"]
    t0 = time.perf_counter()
    if is_remote(exp):
        print(f"report: `cem-bench report {exp} --out results/{done['name']}/report` (reads the storage)")
    else:   # a folder of this machine, file:// or not: the report is built in place
        exp = local(exp)
        try:   # the import too: a report that cannot even load (code upgraded under a long search) loses nothing
            from .analysis.report import build_report
            index = build_report(exp)
            print(f"report: {index}")
            print_hypotheses(index, exp)
        except KeyboardInterrupt:   # Ctrl-C or SIGTERM while drawing: the tables are written, the page is not
            print(f"cem-bench: stopped before the report was written; the tables are complete: build it with "
                  f"`cem-bench report {exp}`", file=sys.stderr, flush=True)
            raise
        except Exception as e:  # noqa: BLE001 - the tables are written; the report can be rebuilt
            print(f"cem-bench: the report could not be built ({type(e).__name__}: {e}); "
                  f"rebuild it with `cem-bench report {exp}`", file=sys.stderr)
    stopped = f", {done['stopped']} stopped early" if done.get("stopped") else ""
    interrupted = f", {done['interrupted']} interrupted" if done.get("interrupted") else ""
    print(f"summary: {done['ok']} trial(s) ok, {done['error']} error(s){stopped}{interrupted}; mode "
          f"{stats.get('mode')}; wall {done['seconds'] + time.perf_counter() - t0:.1f} s = Ray start "
          f"{stats.get('ray_start_s', 0):.1f} s + trials {stats.get('trials_s', 0):.1f} s + tables "
          f"{stats.get('write_s', 0):.1f} s + report {time.perf_counter() - t0:.1f} s (+ setup)")
    if stats.get("interrupted"):
        import signal

        from .search.interrupt import EXIT_CODES
        sig = signal.Signals[stats["interrupted"]]
        print(f"interrupted by {sig.name}: the trials in flight keep their last checkpoint; continue with:\n"
              f"  {stats['resume_command']}")
        return EXIT_CODES[sig]
    if not done["ok"] and done["error"]:
        # a search that ran and finished no trial at all is a failure a script or `ray job submit` must see;
        # some errored trials among finished ones are a search's normal course (exit 0)
        print(f"cem-bench: no trial of {done['name']} finished ({done['error']} error(s)); the reasons are in the "
              f"report's \"Errored trials\" table and trials.parquet's error column", file=sys.stderr)
        return 1
    return 0


def _holds_a_link(folder: str) -> bool:
    """Is ``folder`` a symbolic link, or does it hold one (its own entries only)?"""
    if os.path.islink(folder):
        return True
    try:
        return any(e.is_symlink() for e in os.scandir(folder))
    except OSError:
        return False


def cmd_report(args) -> int:
    from .analysis.report import write_report
    from .schema import REPORT_DIR
    from .storage import is_uri, local
    if args.out:   # before the results are read (a remote folder is fetched into --out/source first)
        # file:// is a folder of this machine (it made a folder named "file:" in the current one); the report is
        # written locally, so object storage is refused here, before the work
        out = local(args.out)
        if is_uri(out):
            raise ConfigError(f"--out {args.out}: a report is written to a folder of this machine; give a local "
                              f"folder (results on object storage are read from there). Nothing was written")
        args.out = out
        check_out_folder(args.out, "the report", "Nothing was written")
        check_report_out(args.out)
    results_dir = local(args.results_dir)   # file:// is a folder of this machine: write_report reads it in place
    default = os.path.join(results_dir, REPORT_DIR)
    if not args.out and os.path.isdir(results_dir) and not _holds_a_link(default):   # a file: load_results says so
        # the default folder is checked as --out is: a user's own index.html or configs.csv in RESULTS/report was
        # replaced without a word (2026-12-07 probe), where the same folder named by --out was refused. A link
        # there, or in it, is write_report's to refuse, naming the link
        check_report_out(default, f"the report's folder {default} (the default, RESULTS/{REPORT_DIR}; --out names "
                                  f"another)")
    path, res = write_report(results_dir, args.out)
    print(f"report: {path}")
    driver = res.running_driver   # the lock as the page read it: stderr and the page never disagree
    if driver is not None:   # the page says so first too (report.page.running_note)
        from .analysis.results import running_text
        print(f"cem-bench: {running_text(results_dir, driver)}: this report holds the trials finished so far; the "
              f"search writes the whole one when it ends", file=sys.stderr)
    print_hypotheses(path, os.path.join(args.out, "source") if is_uri(results_dir) else results_dir)
    return 0


def print_hypotheses(index, results_dir) -> None:
    """One line per hypothesis the space wrote down (the report's ``hypotheses.csv``, just written beside
    ``index``): its claim, the difference, the adjusted p and the verdict, so the terminal gives the answer the
    run was made for; or why the saved family cannot be tested."""
    from pathlib import Path

    import pandas as pd

    from .analysis.noise import p_digits
    from .analysis.report.load import read_space_hypotheses
    try:
        _, problem = read_space_hypotheses(Path(results_dir))
    except Exception as e:  # noqa: BLE001 - the page was built; a damaged search_space.json is named there
        problem = f"the saved space could not be read ({type(e).__name__})"
    if problem:
        print(f"hypotheses: {problem}")
    tested = Path(index).parent / "hypotheses.csv"
    if not tested.is_file():
        return
    for _, r in pd.read_csv(tested).iterrows():
        # the interval is two-sided 95 % and unadjusted (it shows the size); the verdict is the one-sided adjusted
        # test's, so a claim can hold while the interval still reaches 0: the line says which is which
        diff = "" if not math.isfinite(r["diff"]) else \
            f"; a - b = {r['diff']:.4g} (two-sided 95 %: {r['ci_low']:.4g} to {r['ci_high']:.4g})"
        adj = "" if not math.isfinite(r["p_adjusted"]) else f", adjusted p {p_digits(r['p_adjusted'])}"
        print(f"hypothesis {r['name']}: {r['metric']}, {r['claim']}{diff}{adj}: {r['verdict']}")


def cmd_table(args) -> int:
    from .analysis.table import main as table_main
    return table_main(args)


def cmd_replay(args) -> int:
    from .search.replay import main as replay_main
    return replay_main(args)


def cmd_bench(args) -> int:
    from .bench import main as bench_main
    check_out_file("--json", getattr(args, "json", None), "Nothing was measured", "bench")
    return bench_main(args)


class _VersionAction(argparse.Action):
    """``cem-bench --version``: what a bug report or a result should name. Built when asked, not with the parser:
    the commit is a git call and torch's version an import (every other command would pay for them)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata

        import torch

        from . import __version__
        from .provenance import git_sha, library_versions
        search = []
        for name in ("ray", "optuna", "pandas", "pyarrow"):   # the search and the tables, beside the numbers' own
            try:
                search.append(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                search.append(f"{name} ?")
        print(f"cem-bench {__version__} (commit {git_sha()})\ntorch {torch.__version__}, {library_versions()}\n"
              f"{', '.join(search)}")
        parser.exit()


def make_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="cem-bench", description="Accuracy-vs-privacy frontier of CEM defenses for split learning.",
                  epilog=EPILOG)
    p.add_argument("--version", action=_VersionAction, nargs=0,
                   help="print the package, its commit and the libraries that shape the numbers, then exit")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train one run (CEM trainer + attack)", epilog=EPILOG)
    t.add_argument("--config", type=_path, help="YAML file of config keys (flat dotted or nested sections)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a config key (repeatable)")
    t.add_argument("--out", type=_path, help="output folder (default results/runs/<time>)")
    t.add_argument("--threads", type=_threads, metavar="N", help="torch threads (default: torch's, one per "
                   "core; two runs at once on a small CPU each want fewer, as a search's trials get "
                   "resources.cpu); recorded in metrics.json as torch_threads")
    t.set_defaults(func=cmd_train)

    a = sub.add_parser("attack", help="re-attack a saved run or a search's trial (any attacks: --set "
                       "attack.names=[rmle])", epilog=EPILOG)
    a.add_argument("run_dir", type=_path, help="the --out folder of `cem-bench train`, or a search trial's folder (its encoder "
                   "from its latest checkpoint, which is the one it attacked)")
    a.add_argument("--set", action="append", default=[], metavar="attack.KEY=VALUE")
    a.add_argument("--threads", type=_threads, metavar="N", help="torch threads (default: the run's own, "
                   "as its result records them, so that a re-attack on the CPU repeats the trial's arithmetic)")
    a.set_defaults(func=cmd_attack)

    s = sub.add_parser("search", help="Ray Tune + Optuna multi-objective search")
    s.add_argument("space", type=_path, help="search-space YAML (see search_spaces/)")
    s.add_argument("--name", help="experiment name (default: the space's name)")
    s.add_argument("--storage", type=_path, help="storage folder or URI (DIR, s3://..., gs://...); default ./results")
    s.add_argument("--address", help="connect to a running Ray cluster (auto or HOST:PORT); default: start Ray")
    s.add_argument("--num-samples", type=int, help="override num_samples")
    s.add_argument("--max-concurrent", type=int, help="trials at once, whatever the space says (default: the "
                   "space's max_concurrent; without --address lowered to what this machine's GPUs and CPUs hold; "
                   "the first line printed says how many and why)")
    s.add_argument("--gpus-per-trial", type=float, help="override resources.gpu: a fraction of one GPU (0.125 = 8 "
                   "trials a GPU), 1 (a whole GPU: a trial trains on one) or 0; without --address it also fills "
                   "this machine's GPUs (GPUs / F at once, unless --max-concurrent)")
    s.add_argument("--cpus-per-trial", type=float, help="override resources.cpu (fractions allowed); the CPUs can "
                   "hold fewer trials than the GPUs")
    s.add_argument("--resume", action="store_true", help="continue an interrupted search (Tuner.restore). Ray "
                   "restores its own state from pickles in the experiment folder: resume only experiments whose "
                   "storage you trust as much as the code (docs/cluster.md)")
    s.add_argument("--trust-pickled-state", action="store_true",
                   help="with --resume: also read a resume bundle that cem-bench wrote as a pickle before "
                        "2026-11-26 (reading it runs whatever code it holds: only for a file you wrote yourself)")
    s.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                   help="CUDA MPS for trials sharing a GPU on this machine: auto (when resources.gpu < 1 and a "
                        "GPU is visible), on (an error if it cannot start), off")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a fixed config key")
    s.add_argument("--dry-run", action="store_true",
                   help="run every check a search makes before Ray starts (the space, --storage, the data, the "
                        "device; with --resume, that the experiment can be continued), print its plan, the "
                        "searched and fixed keys, then stop: nothing is started or written")
    s.set_defaults(func=cmd_search)

    r = sub.add_parser("report", help="Parquet tables, frontier plots and HTML report of a results folder")
    r.add_argument("results_dir", type=_path, help="a results folder, local or on object storage (s3://, gs://)")
    r.add_argument("--out", type=_path, help="report folder (default RESULTS_DIR/report; required for s3:// and gs://)")
    r.set_defaults(func=cmd_report)

    t = sub.add_parser("table", help="the paper-style table: rows sigma, columns lambda x surrogate, mean +- std "
                                     "over replicates")
    t.add_argument("results_dir", type=_path, help="a results folder (local or s3://, gs://) of `cem-bench search`")
    fmt = t.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV instead of Markdown")
    fmt.add_argument("--latex", action="store_true", help="LaTeX instead of Markdown: a booktabs table float per "
                     "table, its legend in the caption, labelled tab:EXPERIMENT-METRIC")
    t.add_argument("--metrics", nargs="+", help="metrics to tabulate (default: test_acc attack_ssim attack_psnr "
                                                "attack_mse)")
    t.set_defaults(func=cmd_table)

    r = sub.add_parser("replay", help="replay a recorded search through the early-stopping scheduler in simulated "
                                      "time, without training: the probe's rank correlations, then epochs saved "
                                      "and hypervolume kept for each grace x eta (docs/search.md)")
    r.add_argument("results_dir", type=_path, help="the experiment folder of a search whose trials ran to the end with the "
                                       "probe recorded at every epoch (attack.probe_epochs)")
    r.add_argument("--grace", type=int, nargs="+", default=[1, 2, 3], help="grace epochs to try (first rung)")
    r.add_argument("--eta", type=float, nargs="+", default=[2.0, 3.0], help="reduction factors to try")
    r.add_argument("--orders", type=int, default=50, help="random arrival orders per setting (1 to 10,000)")
    r.add_argument("--workers", type=int, default=4, help="trials running at once in the simulation")
    r.add_argument("--seed", type=int, default=0, help="seed of the arrival orders")
    r.set_defaults(func=cmd_replay)

    b = sub.add_parser("bench", help="performance harness", formatter_class=_BenchHelp)
    b.add_argument("--device", default="cpu", help="cpu or cuda")
    b.add_argument("--quick", action="store_true", help="smallest sizes (CI)")
    b.add_argument("--json", type=_path, help="also write the table as JSON here")
    b.add_argument("--only", nargs="+", metavar="GROUP", help=f"only these row groups ({BENCH_GROUPS}); default: all")
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser("calibrate", help="the CEM strength per unit λ of every surrogate on your configuration "
                                         "(and the λ or cem.loss_scale that matches gmm's)", epilog=EPILOG)
    c.add_argument("--config", type=_path, help="YAML file of config keys (dataset, width, σ, batch, ...)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a config key (repeatable)")
    c.add_argument("--surrogates", nargs="+", metavar="NAME", help="which surrogates (default: all; gmm is always "
                   "measured, as the reference)")
    c.add_argument("--warmup", type=int, nargs="+", help="epochs of the λ = 0 reference run before every "
                   "surrogate is measured; several (2 3 5) measure after each from one run (default: each surrogate "
                   "after its own cem.warmup_epochs, where a matched trial of it measures its scale)")
    c.add_argument("--batches", type=int, default=32, help="held-out batches averaged per surrogate (default 32, "
                   "at most 256: each is kept in memory)")
    c.add_argument("--seeds", type=int, nargs="+", help="one reference state per seed, strengths averaged "
                   "geometrically (default: the config's seed alone)")
    c.add_argument("--json", type=_path, help="also write the table here: {configuration: what was measured, "
                   "records: one per surrogate and warm-up}")
    c.add_argument("--yaml", type=_path, help="also write the matching cem.loss_scale of each surrogate here (YAML)")
    c.set_defaults(func=cmd_calibrate)

    k = sub.add_parser("keys", help="list every configuration key with its default (per surrogate, attack or dataset "
                       "where it depends on them), allowed values and help, and the registered surrogates and attacks")
    k.add_argument("pattern", nargs="*", help="only the keys whose name contains one of these (cem., num_slots)")
    k.add_argument("--surrogate", help="only the keys this surrogate reads, with its own defaults")
    k.add_argument("--attack", help="only the keys this attack reads, with its own defaults")
    k.add_argument("--dataset", help="the defaults on this dataset (data.dataset)")
    k.add_argument("--json", action="store_true", help="machine-readable: {surrogates, attacks, datasets, keys: "
                   "[{name, default, defaults_by, choices, range, applies_to, help, ...}]}")
    k.set_defaults(func=cmd_keys)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    from .search.interrupt import terminating_raises
    with terminating_raises():   # SIGTERM runs every finally, as Ctrl-C does (search/interrupt.py)
        return _dispatch(args)


def _dispatch(args) -> int:
    from .errors import DataDownloadError, DataError, ResultsError, StorageFull, TrialDiverged
    from .search.interrupt import Terminated
    try:
        return args.func(args)
    except ResultsError as e:
        print(f"cem-bench: results error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"cem-bench: configuration error:\n{e}", file=sys.stderr)
        return 2
    except (DataError, DataDownloadError) as e:   # a download the network cut is a data error here too
        print(f"cem-bench: data error: {e}", file=sys.stderr)
        return 2
    except StorageFull as e:
        print(f"cem-bench: {e}", file=sys.stderr)
        return 2
    except TrialDiverged as e:
        print(f"cem-bench: the trial diverged: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"cem-bench: terminated (SIGTERM){_unsaved(args)}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"cem-bench: interrupted{_unsaved(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:   # `cem-bench table DIR | head`
        return 0
    except OSError as e:   # a file or folder the command writes or reads: one line, not a traceback
        print(f"cem-bench: {os_error_message(e, search=args.func is cmd_search)}", file=sys.stderr)
        return 2


def _unsaved(args) -> str:
    """What a stopped ``train`` or ``attack`` leaves: nothing (each writes its folder when it ends), said so
    that the epochs done are not looked for; a search says its own (its --resume line)."""
    if args.func is cmd_train:
        return ": nothing was saved (`train` writes its --out folder when the run ends); run it again"
    if args.func is cmd_attack:
        return ": no attack folder was written; the run is unchanged"
    return ""


def os_error_message(e: OSError, search: bool = False) -> str:
    import errno
    where = f" ({e.filename})" if e.filename else ""
    if e.errno == errno.ENOSPC:
        import shutil
        free = ""
        try:   # only where the error names its file: the working folder's free space said nothing of the disk
            if e.filename:
                free = f"; {shutil.disk_usage(os.path.dirname(str(e.filename)) or '.').free / 2**20:.0f} MiB free there"
        except OSError:
            pass
        # a search that made its folder is refused as "already exists" when run again: it goes on with --resume,
        # or, its trials ended, its tables and report are built by `report`
        again = ("run the command again (with --resume where it is refused as \"already exists\"; where every "
                 "trial had ended, `cem-bench report` on the experiment folder builds its tables and report)"
                 if search else "run the command again")
        if not e.filename:   # the error names no file: say which disks the command writes to (2026-12-07 probe:
            # a full $TMPDIR, where the report draws before publishing, read as a full --out)
            import tempfile
            where = f" (the command's output folder, or the temporary folder {tempfile.gettempdir()}, $TMPDIR)"
        return (f"no space left on the device{where}{free}. Free some space and {again} (what was "
                f"written before is intact: every result file is replaced atomically)")
    # pyarrow's S3 errors are OSErrors with no strerror: the reason (a host that could not be resolved, a
    # denied bucket) is only in the text
    reason = e.strerror or " ".join(str(e).split())[:500] or type(e).__name__
    return f"{reason}{where}"


if __name__ == "__main__":
    sys.exit(main())
