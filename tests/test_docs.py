"""The docs are tested (issue 28 item 5): README.md, every docs/*.md and the comments of search_spaces/*.yaml.

Fast (no Ray, no training): the real argument parser, the config key table and the search-space validator.
Each check collects every problem of every page and fails with one line per problem,
``page:line: what is wrong; what would be valid``. The negative tests at the end run each checker on a page
written to ``tmp_path`` with a broken command, key, path, space and figure, so the suite shows its own teeth.

What a page must do to pass, and the conventions it may use:

1. **Commands.** Every ``cem-bench ...`` command (also ``.venv/bin/cem-bench ...`` and ``python -m
   cem_bench.cli ...``) in a fenced code block (languages bash, sh, shell, console, text or none), in an inline
   code span, or on a comment line of a search space, parses with ``cem_bench.cli.make_parser()``, options
   written in full (no abbreviations). A command is recognised where a shell would run it: first on its line
   (after ``$`` and ``VAR=value``) or after ``&&``, ``||``, ``;``, ``|``, ``--``; also inside a quoted shell
   line (``ray exec ... "cd x && cem-bench ..."``). Conventions:

   - a placeholder is a word in CAPITALS (``SPACE``, ``RUN_DIR``, ``N``, ``SPACE.yaml``, ``s3://BUCKET/x``,
     ``--set KEY=VALUE``), anything with ``<angle brackets>``, ``…``, ``...`` or ``$VARIABLE``; an option that
     takes a number is given ``1`` for it, and nothing a placeholder names is looked up;
   - a syntax summary needs no marker: ``[--opt X]`` is optional and parsed as if given; in an inline span
     ``a|b|c`` are alternatives, each parsed; a standalone ``...`` repeats the value before it, or after an
     option stands for its values;
   - an inline span may name a command or an option without its arguments (``cem-bench table``,
     ``cem-bench search --mps``); a line of a fenced block is a whole command and must be complete.

   Beyond parsing: ``--set KEY=VALUE`` names an existing key with a valid value (``cem-bench attack``:
   ``attack.*`` keys and ``train.device``/``train.eval_batch_size`` only); a search space or ``--config`` file
   given as a path in the repository exists, and a search's space validates with the command's overrides
   (``--num-samples``, ``--gpus-per-trial``, ``--set`` ...) as ``cem-bench search`` checks it before Ray
   starts; ``make TARGET`` names a target of the Makefile.
2. **Keys.** Every ``section.name`` in the prose (in a code span or not; in a search space, its comments), where
   section is a config section (``cem_bench.config.SECTIONS``), also as ``config.section.name``, is a key of
   ``key_specs()`` (the table ``cem-bench keys`` prints, plug-in keys included; ``LEGACY_KEYS`` are read too),
   and ``section.name=VALUE`` has a value ``TrialConfig.from_flat`` accepts. Not keys: names with a file
   extension (``data.py``), calls (``data.splits(...)``), capitalised or module attributes
   (``data.BatchIterator``, ``data.make_synthetic``), and a code span that quotes the error about an unknown
   key (it says "unknown").
3. **Paths.** Every repository path a page cites exists: ``docs/…``, ``search_spaces/…``, ``cem_bench/…``,
   ``scripts/…``, ``tests/…`` (a ``tests/x.py::test_name`` names a test of that file), ``cluster.yaml``,
   ``Makefile``, ``README.md``, ``pyproject.toml`` anywhere in the text; every relative markdown link (relative
   to the page's folder, its ``#anchor`` ignored); a bare ``name.md`` / ``name.yaml`` (at the root, in docs/ or
   in search_spaces/); a module named by itself (``searcher.py``, ``bench/ray.py``: a file of the repository,
   unless it is one of the paper's files in ``EXTERNAL_PY``). Outputs (``results/…``, ``/tmp``, ``$OUT``,
   ``~/``) and placeholders are not looked up.
4. **Search spaces.** Every search_spaces/*.yaml validates (``load_space``). A YAML block of a page with
   ``params`` or ``objectives`` at its top level is a search space and validates; a block that is only part of
   one is marked by ``<!-- fragment -->`` on the line before its fence, and a block of other top-level space
   keys alone (``baseline: {replicates: 3}``) is a fragment by itself: a fragment validates once completed
   with a minimal space (its own keys win).
5. **Figures.** ``FIGURES`` names the figures that appear on more than one page, each with its owner (the
   page that measured it; docs/performance.md owns the timings) or with the search space whose plan gives it
   (trial and cell counts), and regular expressions that find it where it is stated. The owner states it; any
   other page that states it states a value within what the owner states (the same, a rounding of it, or a
   part of its range), or links to the owner instead of repeating it. docs/performance-history.md is exempt:
   it keeps earlier figures. A figure whose owner no longer states it fails too: update its patterns here.
6. **Citations.** A page named and then a quoted name (``[estimators.md](estimators.md) "Taken apart"``,
   ``docs/performance.md "The paper grid"``, in a search space's comments too) cites a place of that page: the
   name (whitespace collapsed, ``lambda`` read as λ) is in one of its headings or begins a bold run of its
   text (a bullet's lead, ``**Taken apart: ...``). A renamed heading or bullet leaves no citation pointing
   nowhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import math
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


# =========================================================================================== pages
@dataclasses.dataclass
class Page:
    """A page to check: markdown (``md``) or a search space (``yaml``: only its comments are prose)."""
    rel: str
    path: Path
    text: str

    @property
    def kind(self) -> str:
        return "yaml" if self.path.suffix in (".yaml", ".yml") else "md"

    @functools.cached_property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    @functools.cached_property
    def fences(self) -> list[Fence]:
        return find_fences(self.lines) if self.kind == "md" else []

    @functools.cached_property
    def prose(self) -> str:
        """The text outside fenced blocks (markdown) or the comments (YAML), one line per line of the file."""
        if self.kind == "yaml":
            return "\n".join(yaml_comment(line) for line in self.lines)
        out = list(self.lines)
        for f in self.fences:
            for i in range(f.open_line - 1, f.open_line + len(f.lines) + 1):
                if i < len(out):
                    out[i] = ""
        return "\n".join(out)

    @functools.cached_property
    def _span_matches(self) -> list[re.Match]:
        return [m for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", self.prose, re.S)
                if not re.search(r"\n[ \t]*\n", m.group(2))]

    @functools.cached_property
    def spans(self) -> list[tuple[int, str]]:
        """Inline code spans of the prose: (line, content with whitespace collapsed)."""
        return [(line_of(self.prose, m.start()), " ".join(m.group(2).replace("\\|", "|").split()))
                for m in self._span_matches]

    @functools.cached_property
    def plain(self) -> str:
        """The prose without its code spans (blanked, lines kept)."""
        text = self.prose
        for m in reversed(self._span_matches):
            text = text[:m.start()] + re.sub(r"[^\n]", " ", m.group(0)) + text[m.end():]
        return text


@dataclasses.dataclass
class Fence:
    lang: str
    open_line: int            # 1-based line of the ``` opener
    lines: list[str]
    fragment: bool            # <!-- fragment --> on the line(s) before the opener


def find_fences(lines: list[str]) -> list[Fence]:
    fences, i = [], 0
    while i < len(lines):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        mark, j = m.group(1), i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(mark[0])}{{{len(mark)},}}\s*$", lines[j]):
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        fragment = k >= 0 and re.search(r"<!--\s*fragment\b", lines[k]) is not None
        fences.append(Fence(m.group(2).lower(), i + 1, lines[i + 1:j], fragment))
        i = j + 1
    return fences


def yaml_comment(line: str) -> str:
    """The comment of a YAML line ('' if none): a # at the start or after whitespace, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[i + 1:]
    return ""


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def load_page(path: Path, root: Path = ROOT) -> Page:
    try:
        rel = str(path.relative_to(root))
    except ValueError:
        rel = str(path)
    return Page(rel, path, path.read_text(encoding="utf-8"))


def doc_pages() -> list[Page]:
    return [load_page(p) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]


def space_pages() -> list[Page]:
    return [load_page(p) for p in sorted((ROOT / "search_spaces").glob("*.yaml"))]


def all_pages() -> list[Page]:
    return doc_pages() + space_pages()


# ===================================================================================== placeholders
CAPS = re.compile(r"^[A-Z][A-Z0-9_]*(?:\.[a-z0-9]+)?$")


def is_placeholder(s: str) -> bool:
    """A value the reader fills in: CAPITALS (also as a path component or the key of KEY=VALUE), <angle
    brackets>, an ellipsis, a $VARIABLE."""
    if any(t in s for t in ("<", "…", "...", "$")):
        return True
    return any(CAPS.match(part) for part in re.split(r"[/=:]", s) if part)


# ========================================================================================= commands
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text", "none"}
CMD_WORD = re.compile(r"^(?:cem-bench|(?:[\w.~-]*/)*bin/cem-bench)$")
PYTHON_WORD = re.compile(r"^(?:[\w.~-]*/)*python(?:3(?:\.\d+)?)?$")
ENV_WORD = re.compile(r"^[A-Za-z_]\w*=")
SEPARATORS = {"&&", "||", ";", "|", "&", "--", "$", "time", "nohup", "exec", "!"}
PUNCT = set("();<>|&")


def shell_words(line: str, inline: bool) -> list[str]:
    """Words of a shell line: fenced lines split at shell operators and drop # comments; inline spans keep
    ``a|b`` together (alternatives) and have no comments."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=False if inline else "();<>|&")
    lex.whitespace_split = True
    lex.commenters = "" if inline else "#"
    try:
        return list(lex)
    except ValueError:          # an unbalanced quote: prose, not a command
        return line.split()


def at_command_position(words: list[str], i: int) -> bool:
    j = i - 1
    while j >= 0 and ENV_WORD.match(words[j]):
        j -= 1
    return j < 0 or words[j] in SEPARATORS


def commands_in(words: list[str]) -> list[tuple[str, list[str]]]:
    """(program, arguments) of every cem-bench or make command in ``words``; quoted arguments that hold a
    shell line (``ray exec ... "cd x && cem-bench ..."``) are searched too."""
    out = []
    for i, w in enumerate(words):
        start = None
        if CMD_WORD.match(w):
            start, prog = i + 1, "cem-bench"
        elif PYTHON_WORD.match(w) and words[i + 1:i + 3] == ["-m", "cem_bench.cli"]:
            start, prog = i + 3, "cem-bench"
        elif w == "make":
            start, prog = i + 1, "make"
        elif " " in w and ("cem-bench" in w or "cem_bench.cli" in w):
            out += commands_in(shell_words(w, inline=False))
        if start is None or not at_command_position(words, i):
            continue
        args = []
        for a in words[start:]:
            if a and set(a) <= PUNCT:
                break
            args.append(a)
        out.append((prog, args))
    return out


@dataclasses.dataclass
class Command:
    page: str
    line: int
    text: str            # as the page writes it, for the message
    prog: str            # cem-bench or make
    args: list[str]
    complete: bool       # a fenced line (complete) or an inline span (may leave out arguments)


def commands_of(page: Page) -> list[Command]:
    found: list[Command] = []

    def add(line: int, text: str, inline: bool):
        for prog, args in commands_in(shell_words(text, inline)):
            found.append(Command(page.rel, line, " ".join([prog, *args]), prog, args, not inline))

    for f in page.fences:
        if f.lang not in SHELL_LANGS:
            continue
        i = 0
        while i < len(f.lines):
            start, text = i, f.lines[i]
            while text.rstrip().endswith("\\") and i + 1 < len(f.lines):
                i += 1
                text = text.rstrip()[:-1] + " " + f.lines[i].strip()
            add(f.open_line + 1 + start, text.strip(), inline=False)
            i += 1
    if page.kind == "yaml":                     # a comment line that is a command: `#   cem-bench search ...`
        for n, line in enumerate(page.prose.split("\n"), 1):
            if line.strip() and "`" not in line:
                add(n, line.strip(), inline=False)
    for n, content in page.spans:
        add(n, content, inline=True)
    return found


@functools.cache
def parser_and_subparsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from cem_bench.cli import make_parser
    parser = make_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    def fail(message):
        raise ParseFailure(message)
    for p in (parser, *subs.values()):
        p.error = fail
        p.allow_abbrev = False      # a page writes options in full: an abbreviation breaks when an option is added
    return parser, dict(subs)


class ParseFailure(Exception):
    pass


def expand_syntax(args: list[str], sub: argparse.ArgumentParser | None, inline: bool
                  ) -> tuple[list[list[str]], set[str]]:
    """The argument lists a command stands for: [optional] groups included, ``...`` resolved, each
    alternative of ``a|b`` (inline), placeholders of numeric options replaced by 1. Also the options whose value
    was a placeholder."""
    opts = sub._option_string_actions if sub is not None else {}
    words, depth, ph_opts = [], 0, set()
    for a in args:
        while a.startswith("[") and len(a) > 1:
            a, depth = a[1:], depth + 1
        while depth and a.endswith("]") and a.count("]") > a.count("["):
            a, depth = a[:-1], depth - 1
        if a in ("...", "…"):
            prev = words[-1] if words else ""
            if prev.startswith("-") and prev in opts and opts[prev].nargs != 0:
                words.append("X")           # the option's values
            continue                        # otherwise: "repeat the value before"
        if a:
            words.append(a)
    alts = [w.split("|") if inline and "|" in w and w != "|" else [w] for w in words]
    n = max((len(a) for a in alts), default=1)
    variants = [[a[min(i, len(a) - 1)] for a in alts] for i in range(n)]
    out = []
    for v in variants:
        typ, fixed = None, []
        for w in v:
            if w.startswith("-") and w.split("=")[0] in opts:
                act = opts[w.split("=")[0]]
                typ = act.type if act.nargs != 0 else None
                fixed.append(w)
            elif typ in (int, float) and is_placeholder(w):
                ph_opts.add(fixed[-1] if fixed and fixed[-1].startswith("-") else "")
                fixed.append("1")
            else:
                fixed.append(w)
        out.append(fixed)
    return out, ph_opts


LEGACY_KEYS = {"attack.kind": "read as attack.names: [X] (TrialConfig.from_flat; results of older versions)"}
ATTACK_ALSO = ("train.device", "train.eval_batch_size")     # what `cem-bench attack --set` takes besides attack.*


@functools.cache
def specs() -> dict:
    from cem_bench.config import key_specs
    return key_specs()


@functools.cache
def sections() -> tuple[str, ...]:
    from cem_bench.config import SECTIONS
    return tuple(SECTIONS)


def key_problem(key: str, value: str | None = None) -> str | None:
    """Why ``key`` (= ``value``) is not a valid config setting, or None."""
    from cem_bench.config import ConfigError, TrialConfig
    if key not in specs():
        if key in LEGACY_KEYS:
            return None
        close = difflib.get_close_matches(key, specs(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        sec = key.split(".")[0]
        where = f"`cem-bench keys {sec}.`" if sec in sections() else "`cem-bench keys`"
        return f"unknown config key {key!r} ({hint}{where} lists the keys)"
    if value is not None and not is_placeholder(value):
        try:
            TrialConfig.from_flat({key: value})     # the type, the range and the plug-in names
        except ConfigError as e:
            return " ".join(str(e).split())
    return None


def repo_path(s: str, root: Path = ROOT) -> Path | None:
    """The repository file a command argument names, or None when it is an output, a URI, an absolute path
    outside the repository or a placeholder."""
    if is_placeholder(s) or re.match(r"^[a-z][a-z0-9+.-]*://", s):
        return None
    if "search_spaces/" in s:                       # also /home/ray/cem-bench/search_spaces/x.yaml
        return root / s[s.index("search_spaces/"):]
    if s.startswith(("/", "~", "results/")) or s in ("results", ".", ".."):
        return None
    return root / s


def check_command(cmd: Command, root: Path = ROOT) -> list[str]:
    where = f"{cmd.page}:{cmd.line}: `{cmd.text}`"
    if cmd.prog == "make":
        targets = makefile_targets(root)
        bad = [t for t in cmd.args if not t.startswith("-") and "=" not in t and t not in targets]
        return [f"{where}: no Makefile target {t!r} (targets: {', '.join(sorted(targets))})" for t in bad]
    parser, subs = parser_and_subparsers()
    if not cmd.args:
        return [] if not cmd.complete else [f"{where}: no subcommand (choose from {', '.join(subs)})"]
    if is_placeholder(cmd.args[0]):
        return []
    if cmd.args[0] == "--version":   # the parser prints and exits: nothing to parse after it
        return [] if len(cmd.args) == 1 else [f"{where}: --version takes nothing after it"]
    sub = subs.get(cmd.args[0])
    variants, ph_opts = expand_syntax(cmd.args, sub, inline=not cmd.complete)
    problems = []
    for argv in variants:
        try:
            ns = parser.parse_args(argv)
        except ParseFailure as e:
            msg = str(e)
            if not cmd.complete and ("arguments are required" in msg or (
                    re.search(r"expected (one|at least one) argument", msg) and argv[-1].startswith("-"))):
                continue            # an inline span names the command or option without its arguments
            hint = ""
            if "unrecognized arguments" in msg and sub is not None:
                options = [o for o in sub._option_string_actions if o.startswith("--") and o != "--help"]
                hint = f" (cem-bench {cmd.args[0]} takes {', '.join(options)})"
            problems.append(f"{where} does not parse: {msg}{hint}")
            continue
        problems += check_parsed(where, ns, ph_opts, sub, root)
    return list(dict.fromkeys(problems))


def check_parsed(where: str, ns: argparse.Namespace, ph_opts: set[str], sub, root: Path) -> list[str]:
    problems = []
    for item in getattr(ns, "set", None) or []:
        if "=" not in item:
            problems.append(f"{where}: --set {item!r} is not KEY=VALUE")
            continue
        key, value = item.split("=", 1)
        if is_placeholder(key):
            continue
        why = key_problem(key, value)
        if why:
            problems.append(f"{where}: --set {item}: {why}")
        elif ns.cmd == "attack" and not (key.startswith("attack.") or key in ATTACK_ALSO):
            problems.append(f"{where}: cem-bench attack only changes attack.* keys (and {', '.join(ATTACK_ALSO)}); "
                            f"got {key}")
    for dest, what in (("space", "search space"), ("config", "config file")):
        value = getattr(ns, dest, None)
        path = repo_path(value, root) if isinstance(value, str) else None
        if path is None:
            continue
        if not path.is_file():
            known = ", ".join(p.relative_to(root).as_posix() for p in sorted((root / "search_spaces").glob("*.yaml")))
            problems.append(f"{where}: {what} {value!r} does not exist in the repository"
                            + (f" (the spaces: {known})" if dest == "space" else ""))
        elif dest == "space" and not problems:
            problems += check_search_runs(where, ns, ph_opts, sub, path)
    return problems


def check_search_runs(where: str, ns: argparse.Namespace, ph_opts: set[str], sub, path: Path) -> list[str]:
    """``cem-bench search``'s own checks before Ray starts: the options, then the space with the overrides."""
    from cem_bench.config import ConfigError
    from cem_bench.errors import SearchError, SpaceError
    from cem_bench.search.run import check_args, overrides_from_args
    from cem_bench.spaces import load_space
    ns = argparse.Namespace(**vars(ns))
    for opt in ph_opts:                         # a placeholder is not the value a reader would give
        if opt in sub._option_string_actions:
            setattr(ns, sub._option_string_actions[opt].dest, None)
    ns.set = [s for s in ns.set if not is_placeholder(s)]
    try:
        check_args(ns)
        load_space(str(path), overrides_from_args(ns))
    except (SpaceError, SearchError, ConfigError) as e:
        return [f"{where} would stop before Ray starts: {' '.join(str(e).split())}"]
    return []


@functools.cache
def makefile_targets(root: Path = ROOT) -> frozenset[str]:
    text = (root / "Makefile").read_text()
    return frozenset(m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))


def command_problems(pages: list[Page], root: Path = ROOT) -> list[str]:
    return [p for page in pages for cmd in commands_of(page) for p in check_command(cmd, root)]


# ============================================================================================= keys
FILE_EXTS = {"py", "yaml", "yml", "md", "json", "jsonl", "parquet", "csv", "png", "html", "log", "txt", "bin",
             "pt", "pkl", "sh", "toml", "cfg"}
DOTTED = re.compile(r"(?<![\w/.-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def keys_in(text: str) -> list[tuple[str, str | None]]:
    """(key, value or None) of every config key named in ``text`` (a code span, or a line of prose)."""
    out = []
    for m in DOTTED.finditer(text):
        parts = m.group(0).split(".")
        if parts[0] == "config":
            parts = parts[1:]
        if len(parts) != 2 or parts[0] not in sections():
            continue
        if not re.match(r"^[a-z_][a-z0-9_]*$", parts[1]) or parts[1] in FILE_EXTS:
            continue
        rest = text[m.end():]
        if rest.startswith(("(", ".", "/")) or is_python_name(parts[0], parts[1]):
            continue                        # a call, a longer dotted name, a path, a function of cem_bench.core.data
        value = None
        v = re.match(r"=([^\s`,;)]+)", rest)
        if v:           # `train.device='cuda'` and `train.cuda_graph=auto:` in a quoted message: the value itself
            value = v.group(1).rstrip(":.").strip("'\"")
        out.append((".".join(parts), value))
    return out


def is_python_name(module: str, name: str) -> bool:
    """``data.make_synthetic``: a name of the module ``cem_bench.<section>`` (or of a folder that groups rooms:
    ``cem_bench.core.data``), where there is one, not a key."""
    import importlib
    for package in ("cem_bench", *(f"cem_bench.{g}" for g in GROUPS)):
        try:
            if hasattr(importlib.import_module(f"{package}.{module}"), name):
                return True
        except ImportError:
            pass
    return False


def key_problems(pages: list[Page]) -> list[str]:
    problems = []
    for page in pages:
        for line, content in page.spans:
            if any(prog == "cem-bench" for prog, _ in commands_in(shell_words(content, inline=True))):
                continue                    # a command: its --set keys are checked with it
            if re.search(r"\bunknown\b", content):
                continue                    # a quoted error message about an unknown key: an example of the error
            for key, value in keys_in(content):
                why = key_problem(key, value)
                if why:
                    shown = f"{key}={value}" if value is not None else key
                    problems.append(f"{page.rel}:{line}: `{shown}`: {why}")
        for line, text in enumerate(page.plain.split("\n"), 1):       # keys named outside code spans
            for key, value in keys_in(text):
                why = key_problem(key, value)
                if why:
                    problems.append(f"{page.rel}:{line}: {key}{'=' + value if value is not None else ''}: {why}")
    return problems


# ============================================================================================ paths
# The folders of cem_bench that group rooms (docs/architecture.md §3): `report/load.py` is cem_bench/analysis/...
GROUPS = ("core", "analysis")
REPO_PATH = re.compile(r"(?<![\w./~$@-])(?<!\]\()((?:docs|search_spaces|cem_bench|scripts|tests)/[^\s`'\")\]|,;]*"
                       r"|cluster\.yaml|Makefile|README\.md|pyproject\.toml)(?![\w-])")
BARE_DOC = re.compile(r"(?<![\w./~$@-])(?<!\]\()([A-Za-z][\w-]*\.(?:md|yaml))(?![\w/-])")
PY_FILE = re.compile(r"(?<![\w./~$@-])([\w-]+(?:/[\w-]+)*\.py)\b")
# Files of the CEM paper's code (xiasong0501/CEM) that docs/reference.md and docs/metrics.md discuss: not ours.
EXTERNAL_PY = {"main_MIA.py", "main_test_MIA.py", "model_training_paral_pruning.py", "GMM.py", "MIA_torch.py",
               "run_gan_attack.py", "train_gan.py"}
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@functools.cache
def repo_files(root: Path = ROOT) -> list[str]:
    files = [p.relative_to(root).as_posix() for d in ("docs", "search_spaces", "cem_bench", "scripts", "tests")
             for p in (root / d).rglob("*") if "__pycache__" not in p.parts]
    return files + [p.name for p in root.iterdir() if not p.name.startswith(".")]


def close_files(name: str, root: Path) -> str:
    close = difflib.get_close_matches(name, repo_files(root), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def path_problems(pages: list[Page], root: Path = ROOT) -> list[str]:
    problems = []
    for page in pages:
        text = page.text if page.kind == "md" else page.prose
        seen = set()
        for m in REPO_PATH.finditer(text):
            p = m.group(1).split("#")[0].rstrip(".:")
            if is_placeholder(p) or "{" in p:
                continue
            n = line_of(text, m.start())
            if "*" in p:   # a glob names files: at least one must match (issue 37: globs were skipped)
                if not list(root.glob(p)) and (n, p) not in seen:
                    seen.add((n, p))
                    problems.append(f"{page.rel}:{n}: {p} matches no file{close_files(p.replace('*', ''), root)}")
                continue
            file, _, node = p.partition("::")
            if not (root / file).exists() and (n, file) not in seen:
                seen.add((n, file))
                seen.add((n, Path(file).name))
                problems.append(f"{page.rel}:{n}: {file} does not exist{close_files(file, root)}")
            elif node and (root / file).is_file():
                name = node.split("::")[-1].split("[")[0]
                if not re.search(rf"^\s*(?:async )?(?:def|class) {re.escape(name)}\b", (root / file).read_text(), re.M):
                    problems.append(f"{page.rel}:{n}: {p}: {file} has no test {name}")
        for m in BARE_DOC.finditer(page.prose):
            name = m.group(1)
            if (is_placeholder(name) and not name.endswith(".md")) or REPO_PATH.fullmatch(name):
                # SPACE.yaml is a placeholder; a page in CAPITALS (DESIGN.md) is a file name
                continue
            n = line_of(page.prose, m.start())
            if not any((d / name).exists() for d in (root, root / "docs", root / "search_spaces", page.path.parent)) \
                    and (n, name) not in seen:
                seen.add((n, name))
                problems.append(f"{page.rel}:{n}: {name} is not a file of the repository "
                                f"(looked in ., docs/, search_spaces/){close_files(name, root)}")
        names = {Path(f).name for f in repo_files(root)}
        for m in PY_FILE.finditer(page.prose):      # a module named by itself (`searcher.py`, `bench/ray.py`)
            name = m.group(1)
            if REPO_PATH.fullmatch(name) or name in EXTERNAL_PY:
                continue
            if ("/" in name and not any((root / d / name).exists()
                                        for d in ("", "cem_bench", *(f"cem_bench/{g}" for g in GROUPS)))) or \
                    ("/" not in name and name not in names):
                close = difflib.get_close_matches(name, sorted(names) if "/" not in name else repo_files(root), n=2)
                hint = f" (did you mean {' or '.join(close)}?)" if close else ""
                problems.append(f"{page.rel}:{line_of(page.prose, m.start())}: {name} is not a module of the "
                                f"repository{hint}; a file of the paper's code belongs in EXTERNAL_PY")
        if page.kind != "md":
            continue
        for m in LINK.finditer(page.prose):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue                    # a URL or an anchor of this page
            file = target.split("#")[0]
            if not (page.path.parent / file).exists():
                here = Path(page.rel).parent
                resolved = os.path.normpath(here / file)
                n = line_of(page.prose, m.start())
                if (n, resolved) in seen or (n, Path(resolved).name) in seen:
                    continue                # said above, as the path the link's text cites
                close = difflib.get_close_matches(resolved, repo_files(root), n=1, cutoff=0.6)
                hint = f" (did you mean {os.path.relpath(close[0], here)}?)" if close else ""
                problems.append(f"{page.rel}:{line_of(page.prose, m.start())}: the link to {target!r} leads nowhere: "
                                f"{resolved} does not exist (a link is relative to the page's folder){hint}")
    return problems


# ======================================================================================== citations
# a page (a markdown link, or a bare name.md / docs/name.md) followed by a quoted name of no blank line
CITE = re.compile(r"(?:\]\(\s*<?(?P<link>[^)\s>#]+\.md)(?:#[^)\s>]*)?>?\s*\)|(?<![\w/.-])(?P<bare>(?:[\w-]+/)*[\w-]+\.md)`?)"
                  r"\s*\"(?P<name>[^\"]{3,120}?)\"")


def _flat(text: str) -> str:
    """Text as a citation is matched: whitespace collapsed, λ spelt lambda (a search space's comments are ASCII)."""
    return " ".join(text.replace("λ", "lambda").split())


@functools.cache
def _places(path: Path) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """A page's headings, its bold runs and its whole text, flattened (a bold run is found as ``**Name``)."""
    text = path.read_text()
    heads = tuple(_flat(line.lstrip("#")) for line in text.split("\n") if re.match(r"^#{1,6}\s", line))
    return heads, tuple(_flat(b) for b in re.findall(r"\*\*([^*]+)\*\*", text)), _flat(text)


def citation_problems(pages: list[Page], root: Path = ROOT) -> list[str]:
    problems = []
    for page in pages:
        text = page.prose
        for m in CITE.finditer(text):
            name = _flat(m.group("name"))
            if re.search(r"\n[ \t]*\n", m.group("name")) or not name:
                continue
            if m.group("link"):
                target = (page.path.parent / m.group("link")).resolve()
            else:
                bare = m.group("bare")
                target = next((d / bare for d in (root, root / "docs", page.path.parent) if (d / bare).is_file()), None)
            if target is None or not target.is_file():
                continue                   # a page that does not exist is path_problems' to say
            heads, bold, body = _places(target)
            if any(name in h for h in heads) or f"**{name}" in body:
                continue
            rel = os.path.relpath(target, root)
            close = difflib.get_close_matches(name, [p[:len(name)] for p in heads + bold], n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{page.rel}:{line_of(text, m.start())}: cites {rel} \"{name}\", which is neither a "
                            f"heading of it nor the start of a bold run there{hint}")
    return problems


# ===================================================================================== search spaces
FRAGMENT_BASE = {"name": "fragment", "num_samples": 2, "params": {"cem.lambd": {"choice": [8, 16]}},
                 "objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}]}


def space_problems(pages: list[Page], spaces: list[Path]) -> list[str]:
    from cem_bench.errors import SpaceError
    from cem_bench.spaces import load_space, parse_space
    from cem_bench.spaces.spec import TOP_KEYS
    problems = []
    for path in spaces:
        try:
            load_space(str(path))
        except SpaceError as e:
            problems.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: does not validate: "
                            + "; ".join(str(e).split("\n")))
    for page in pages:
        for f in page.fences:
            if f.lang not in ("yaml", "yml"):
                continue
            where = f"{page.rel}:{f.open_line + 1}"
            try:
                doc = yaml.safe_load("\n".join(f.lines))
            except yaml.YAMLError as e:
                if not f.fragment:
                    problems.append(f"{where}: the YAML block is not valid YAML ({' '.join(str(e).split())}); "
                                    f"mark a part of a file with <!-- fragment --> before the fence")
                continue
            if not isinstance(doc, dict) or not set(doc) <= set(TOP_KEYS):
                if isinstance(doc, dict) and {"params", "objectives"} & set(doc):
                    problems.append(f"{where}: keys {sorted(set(doc) - set(TOP_KEYS))} are not search-space keys "
                                    f"({', '.join(TOP_KEYS)})")
                continue
            whole = bool({"params", "objectives"} & set(doc)) and not f.fragment
            if not whole:
                base = dict(FRAGMENT_BASE)
                sampler = doc.get("sampler")
                if sampler == "grid" or (isinstance(sampler, dict) and sampler.get("name") == "grid"):
                    base.pop("num_samples")
                doc = {**base, **doc}
            try:
                parse_space(doc)
            except SpaceError as e:
                what = "the search space" if whole else "the fragment (completed with a minimal space)"
                problems.append(f"{where}: {what} does not validate: " + "; ".join(str(e).split("\n"))
                                + ("" if not whole else "; if it is only part of a space, put <!-- fragment --> "
                                   "on the line before the fence"))
    return problems


# ========================================================================================== figures
@dataclasses.dataclass(frozen=True)
class Figure:
    name: str
    owner: str                          # the page that owns the figure, or the search space whose plan gives it
    patterns: tuple[str, ...]           # each with a group "v": the figure as a page states it
    unit: str = "number"                # "number" or "duration" ("4 min 17 s", "2.5 min", "33–50 s")
    computed: Callable[[], str] | None = None    # the owner's value, where the owner is a search space's plan


def _plan(space: str, what: str) -> Callable[[], str]:
    def value() -> str:
        from cem_bench.spaces import load_space
        spec = load_space(str(ROOT / "search_spaces" / space))
        return str(spec.total_runs if what == "trials" else spec.num_samples)
    return value


R = r"(?P<v>\d+(?:\.\d+)?(?:\s*[–-]\s*\d+(?:\.\d+)?)?)"        # a number or a range: 1.34–1.36
PERF = "docs/performance.md"
FIGURES = (
    # the demo (make demo)
    Figure("the demo's wall time on the 2-core CPU (as measured: docs/performance.md says under what load)", PERF,
           (r"(?P<v>\d+ min(?: \d+ s)?)\s+(?:of wall time\s+)?(?:on [\d-]+\s+)?once\s+\.venv\s+exist",), "duration"),
    Figure("the time creating .venv adds to the first make demo", PERF,
           (r"creating\s+\.venv\s+adds\s+(?:about\s+)?(?P<v>[\d.]+ min)",), "duration"),
    Figure("the demo's trial times on the 2-core CPU", PERF,
           (r"once\s+\.venv\s+exist[^()]{0,60}\(trials of (?P<v>\d+–\d+ s)\)",), "duration"),
    Figure("the demo's trials", "search_spaces/demo.yaml",
           (r"demo(?:\.yaml)?\s*\)?\s*(?:search\s*)?(?:trains and attacks\s+|[(:]\s*)(?P<v>\d+) trials",
            r"demo\.yaml\s*\|[^|]*?(?P<v>\d+) trials"),
           computed=_plan("demo.yaml", "trials")),
    # the paper grid (cifar10_paper.yaml)
    Figure("the paper grid's cells", "search_spaces/cifar10_paper.yaml",
           (r"(?:5\s*[x×]\s*\(1\s*\+\s*2\s*[x×]\s*5\)|(?:the )?five surrogates\))\s*=\s*(?P<v>\d+)\s+cells",
            r"paper's grid:\s*(?P<v>\d+) cells"),
           computed=_plan("cifar10_paper.yaml", "cells")),
    Figure("the paper grid's trials", "search_spaces/cifar10_paper.yaml",
           (r"(?:cifar10_paper|paper(?:'s)? grid|grid's)(?:(?!\. ).){0,300}?\b(?P<v>\d+) trials\b"
            r"(?! (?:per|to|at|packed|on|share))",),
           computed=_plan("cifar10_paper.yaml", "trials")),
    Figure("the synthetic paper grid's trials", "search_spaces/paper_grid_synthetic.yaml",
           (r"paper_grid_synthetic\.yaml\s*\(?:?\s*(?P<v>\d+) trials", r"seeds 0 and 1: (?P<v>\d+) trials"),
           computed=_plan("paper_grid_synthetic.yaml", "trials")),
    Figure("the λ curve's trials", "search_spaces/lambda_curve.yaml",
           (r"lambda_curve\.yaml\s*\(?:?\s*(?P<v>\d+) trials", r"(?:of the|e7e2e46\):) (?P<v>\d+) trials",
            r"3 seeds each = (?P<v>\d+)"),
           computed=_plan("lambda_curve.yaml", "trials")),
    # one paper trial, H100
    Figure("one paper trial in the grid's fp32 (TF32 convolutions), H100, minutes", PERF,
           (r"(?P<v>[\d.]+) min\s+in the grid's fp32", r"[Oo]ne (?:paper )?trial takes (?P<v>[\d.]+) min",
            r"(?P<v>[\d.]+) min in fp32 with TF32", r"× (?P<v>[\d.]+) min\s+≈", r"the default's (?P<v>[\d.]+)\b",
            r"grid's precision.{0,200}?(?P<v>[\d.]+) min\s+in all",
            r"\(the grid\)\s*(?:\|[^|]*){3}\|\s*(?P<v>[\d.]+) min")),
    Figure("one paper trial in bf16, H100, minutes", PERF,
           (r"(?P<v>[\d.]+) min\s+(?:in )?bf16", r"In bf16: (?P<v>[\d.]+) min",
            r"amp on\s+\(bf16\)\s*(?:\|[^|]*){3}\|\s*(?P<v>[\d.]+) min")),
    Figure("one paper trial in strict fp32, H100, minutes", PERF,
           (r"(?P<v>[\d.]+) min\s+(?:in )?strict fp32", r"strict fp32[^|]{0,60}?(?P<v>\d+\.\d+) min",
            r"\(strict fp32\)\s*(?:\|[^|]*){3}\|\s*(?P<v>[\d.]+) min")),
    Figure("strict fp32 against the grid's precision, paper trial", PERF,
           (r"strict fp32[^|]{0,60}?(?P<v>[\d.]+)×", r"[Ss]trict fp32 costs (?P<v>[\d.]+)×")),
    Figure("the paper grid's H100 GPU-hours, one trial at a time", PERF,
           (r"(?P<v>[\d.]+)\s+(?:H100\s+)?GPU-hours(?:\s*\([^)]*\))?\s+(?:run\s+)?one at a time",)),
    Figure("one cifar10_fast gmm trial alone on an H100 (estimated from the paper trial's parts)", PERF,
           (r"one gmm trial alone (?:would take|at|takes) about (?P<v>[\d.]+ min)",), "duration"),
    # the training step on a GPU
    Figure("the λ = 0 step graphed on the H100, ms", PERF,
           (r"(?P<v>[\d.]+) ms graphed", r"both keys off[^|]*\|\s*(?P<v>[\d.]+) ms")),
    Figure("the λ = 0 step graphed on the H200, ms", PERF,
           (r"(?P<v>[\d.]+) ms on the H200", r"On an H200 the λ = 0 step went from [\d.–]+ to (?P<v>[\d.]+) ms",
            r"µs / (?P<v>[\d.]+) ms")),
    Figure("slot_cross's default step ÷ λ = 0 on a GPU (graphed, own stream, compiled)", PERF,
           (r"slot_cross ÷ λ = 0\s*\|\s*" + R + r"×", r"slot_cross from [\d.]+× to " + R + "×",
            r"to " + R + r"×\s*\(slot_cross\)")),
    Figure("serial_enhanced's default step ÷ λ = 0 on a GPU (graphed, own stream, compiled)", PERF,
           (r"serial_enhanced ÷ λ = 0\s*\|\s*" + R + r"×", r"to " + R + r"×\s*\(serial_enhanced\)")),
    # packing (issue 40's window method, H100): the old pack row's figures were withdrawn
    Figure("packed 2 to a GPU under MPS: the paper grid's H100 GPU-hours", PERF,
           (r"run it:\s+\**" + R + r"\s+H100 GPU-hours",)),
    Figure("four packed gmm trials under MPS against one alone, fp32 (H100)", PERF,
           (r"four " + R + r"×\s+and", r"four packed gmm trials under MPS trained " + R + r"×")),
    Figure("what packing without MPS loses against one trial alone, % (H100)", PERF,
           (R + r" % fewer", r"packing loses " + R + r" %")),
    # the findings against a converged decoder (README "What it has found so far"; docs/estimators.md "Real images")
    Figure("attention_centroid λ 16 beyond gmm λ 48 against the 96-epoch decoder on digits, 24 seeds (M1)",
           "docs/estimators.md",
           (r"M1 holds\s+: (?P<v>[\d.]+) SSIM", r"\| (?P<v>[\d.]+) more private \([\d.–]+\); the accuracy match")),
    Figure("gmm λ 64's drop against the 48-epoch decoder on photos", "docs/estimators.md",
           (r"\| gmm λ 64 \| 1 \|(?:[^|]*\|){4}\s*(?P<v>[−-][\d.]+) \(", r"yes, gmm (?P<v>[−-][\d.]+) and attention_centroid")),
    # the demo's result at seed 0 (docs/protocol.md section 10)
    Figure("the demo's SSIM difference, gmm λ = 16 against λ = 0 (seed 0)", "docs/protocol.md",
           (r"\(Δ (?P<v>[−-][\d.]+), 95 % interval",
            r"\|\s+\|\s*0\s*\|\s*[\d.]+ ± [\d.]+ / [\d.]+ ± [\d.]+\s*\|[^|]*\|\s*(?P<v>[−-][\d.]+) \(")),
)
FIGURE_EXEMPT = {"docs/performance-history.md": "the dated history of earlier measurements"}


@dataclasses.dataclass(frozen=True)
class Value:
    lo: float
    hi: float
    step: float         # the precision it is stated to


def parse_value(s: str, unit: str) -> Value:
    s = s.replace("−", "-").replace(",", "")
    if unit == "duration":
        scale = {"h": 3600.0, "min": 60.0, "s": 1.0}
        rng = re.match(r"^([\d.]+)\s*[–-]\s*([\d.]+)\s*(h|min|s)$", s)
        if rng:
            lo, hi, u = rng.groups()
            step = scale[u] * 10.0 ** -max(decimals(lo), decimals(hi))
            return Value(float(lo) * scale[u], float(hi) * scale[u], step)
        total, step = 0.0, 1.0
        for num, u in re.findall(r"([\d.]+)\s*(h|min|s)\b", s):
            total += float(num) * scale[u]
            step = scale[u] * 10.0 ** -decimals(num)
        return Value(total, total, step)
    nums = re.findall(r"-?\d+(?:\.\d+)?", s.replace("–", " ").replace(" - ", " "))
    vals = [float(n) for n in nums]
    return Value(min(vals), max(vals), 10.0 ** -max(decimals(n) for n in nums))


def decimals(num: str) -> int:
    return len(num.split(".")[1]) if "." in num else 0


def agrees(stated: Value, owner: Value) -> bool:
    """``stated`` is the owner's value to the precision it is stated to: equal, a rounding, or within the
    owner's range."""
    eps = 1e-9 * max(1.0, abs(owner.hi))
    return owner.lo - stated.step / 2 - eps <= stated.lo and stated.hi <= owner.hi + stated.step / 2 + eps


def figure_text(page: Page) -> str:
    """The page's prose (markdown: all of it) on one line, emphasis and code marks as spaces: offsets kept."""
    text = page.text if page.kind == "md" else page.prose
    return re.sub(r"[\n*`]", " ", text)


def figure_statements(fig: Figure, page: Page) -> list[tuple[int, str]]:
    text, out, seen = figure_text(page), [], set()
    for pat in fig.patterns:
        for m in re.finditer(pat, text):
            if m.start("v") not in seen:
                seen.add(m.start("v"))
                out.append((m.start("v"), " ".join(m.group("v").split())))
    return [(line_of(page.text if page.kind == "md" else page.prose, pos), v) for pos, v in sorted(out)]


def banner_problems(pages: list[Page], spaces: list[Path]) -> list[str]:
    """A quoted first line of ``cem-bench search`` (a code span or a fenced block ``N trials ...: ...``) is what it
    prints for one of the shipped spaces or for a search space written out on the same page: the part before a
    ``…`` (and before the concurrency, which depends on the machine) is the beginning of that space's plan."""
    from cem_bench.errors import SpaceError
    from cem_bench.search.run import plan
    from cem_bench.spaces import load_space, parse_space
    shipped = {f"search_spaces/{path.name}": plan(load_space(str(path))) for path in spaces}
    problems = []
    for page in pages:
        plans = dict(shipped)
        for f in page.fences:
            try:
                doc = yaml.safe_load("\n".join(f.lines)) if f.lang in ("yaml", "yml") and not f.fragment else None
                if isinstance(doc, dict) and {"params", "objectives"} & set(doc):
                    plans[f"the space of {page.rel}:{f.open_line + 1}"] = plan(parse_space(doc))
            except (yaml.YAMLError, SpaceError):
                pass                        # reported by test_every_search_space_and_yaml_block_validates
        quoted = page.spans + [(f.open_line + 1, " ".join(" ".join(f.lines).split())) for f in page.fences
                               if f.lang in SHELL_LANGS]     # a fenced line, wrapped or not
        for line, content in quoted:
            if not re.match(r"^\d+ trials(?: at most)?: ", content):
                continue
            head = re.split(r"…|\.\.\.|, \d+ at a time|, as many at a time|, objectives", content)[0].rstrip(" ,")
            if not any(p.startswith(head) for p in plans.values()):
                near = max(plans, key=lambda n: difflib.SequenceMatcher(None, head, plans[n][:len(head)]).ratio())
                problems.append(f"{page.rel}:{line}: `{head} …` is not what `cem-bench search` prints for a shipped "
                                f"space or a space of this page; for {near} it prints `{plans[near]}`")
    return problems


def figure_problems(pages: list[Page], figures=FIGURES) -> list[str]:
    """The owner's value is what its statements span (a page may state a range once and a run's value
    elsewhere); every other statement must lie within it, to the precision it is stated to."""
    problems = []
    pages = [p for p in pages if p.rel not in FIGURE_EXEMPT]
    by_rel = {p.rel: p for p in pages}
    for fig in figures:
        if fig.computed is not None:
            shown = fig.computed()
            owner, owner_says = parse_value(shown, fig.unit), f"{fig.owner} (its plan) gives {shown!r}"
            advice = "state what the space runs (the count `cem-bench search` prints first)"
        else:
            owner_page = by_rel.get(fig.owner)
            stated = figure_statements(fig, owner_page) if owner_page is not None else []
            if not stated:
                problems.append(f"{fig.owner}: {fig.name}: the owner does not state it any more (no match of "
                                f"FIGURES' patterns); update its patterns in tests/test_docs.py or its owner")
                continue
            values = [parse_value(v, fig.unit) for _, v in stated]
            owner = Value(min(v.lo for v in values), max(v.hi for v in values), min(v.step for v in values))
            owner_says = f"{fig.owner} states " + ", ".join(f"{v!r} (line {n})" for n, v in stated[:3])
            advice = f"state the owner's value or link to {fig.owner} instead"
        for page in pages:
            if page.rel == fig.owner:
                continue
            for line, shown in figure_statements(fig, page):
                if not agrees(parse_value(shown, fig.unit), owner):
                    problems.append(f"{page.rel}:{line}: {fig.name}: states {shown!r}, but {owner_says}; {advice}")
    return problems


# ====================================================================================== the tests
def report(problems: list[str], what: str) -> None:
    assert not problems, f"{len(problems)} {what}:\n" + "\n".join(problems)


def test_every_documented_command_parses():
    report(command_problems(all_pages()), "documented commands that do not parse or would not run")


def test_every_documented_config_key_exists():
    report(key_problems(all_pages()), "documented config keys that do not exist")


def test_every_cited_repository_path_exists():
    report(path_problems(all_pages()), "cited paths that do not exist")


def test_every_search_space_and_yaml_block_validates():
    report(space_problems(doc_pages(), sorted((ROOT / "search_spaces").glob("*.yaml"))),
           "search spaces that do not validate")


def test_figures_agree_with_their_owner():
    report(figure_problems(all_pages()) + banner_problems(all_pages(), sorted((ROOT / "search_spaces").glob("*.yaml"))),
           "figures that disagree with their owner")


def test_every_cited_section_exists():
    report(citation_problems(all_pages()), "citations of a place that is not there")


def test_the_checks_see_what_they_check():
    """Guards against a checker that silently finds nothing: the pages hold commands, keys, paths, YAML
    spaces and every figure's owner statement."""
    pages = all_pages()
    cmds = [c for p in pages for c in commands_of(p)]
    assert len([c for c in cmds if c.prog == "cem-bench" and c.complete]) >= 20
    assert {c.args[0] for c in cmds if c.prog == "cem-bench" and c.args} >= {"train", "attack", "search", "report",
                                                                              "table", "bench", "calibrate", "keys"}
    assert sum(len(keys_in(s)) for p in pages for _, s in p.spans) >= 100
    assert sum(1 for p in pages for f in p.fences if f.lang == "yaml") >= 3
    assert len(FIGURES) >= 6        # each owner's statement is checked by test_figures_agree_with_their_owner
    assert sum(1 for p in pages for _ in CITE.finditer(p.prose)) >= 80    # the citations checked


def test_legacy_keys_are_still_read():
    from cem_bench.config import TrialConfig
    assert TrialConfig.from_flat({"attack.kind": "rmle"}).attack.names == ["rmle"]


# ---------------------------------------------------------------------- the checks fail where they should
BROKEN_PAGE = """# A broken page

```bash
cem-bench serch search_spaces/demo.yaml
cem-bench search search_spaces/demo.yaml --gpus 2
cem-bench search search_spaces/nope.yaml
cem-bench train --set cem.lamda=8 --set train.amp=sometimes
cem-bench attack RUN_DIR --set cem.lambd=8
cem-bench search search_spaces/demo.yaml --num-samples 0
make demoo
```

Fine: `cem-bench table RESULTS_DIR [--csv] [--metrics ...]`, `cem-bench search --mps auto|on|off`,
`cem-bench train --set cem.lambd=8`. Broken: `cem-bench search SPACE --mps sometimes`,
`cem-bench table RESULTS_DIR --xlsx`.

Keys: `cem.lambd` and `config.cem.surrogate` exist, `cem.lambda` does not, nor `train.ampp`;
`cem.surrogate=slotcross` is not a surrogate, `train.amp='off':` is. Not keys: `data.py`, `data.BatchIterator`, `trials.parquet`,
`torch.compile`, `model.forward(x)`; nor is cem.lamdba, outside a code span.

Paths: `search_spaces/demo.yaml` and [the docs](docs/performance.md#gpu) exist; `docs/performence.md`,
[a link](docs/nowhere.md#x), `scripts/gpu_chek.py`, `tests/test_docs.py::test_nothing_like_this` and
`SURROGATES.md` do not, nor `searchr.py`. Outputs: `results/demo/report`,
`results/<name>/trials.parquet`, `docs/X.md`.

```yaml
name: broken
objectives: [{metric: test_acc, mode: max}, {metric: attack_ssim, mode: min}]
num_samples: 2
params:
  cem.lambd: {loguniform: [64, 1]}
```

<!-- fragment -->
```yaml
params:
  cem.lambd: {choice: [8, 16]}
```

```yaml
baseline: {replicates: -1}
```

Citations: docs/performance.md "The paper grid" and docs/estimators.md "Taken apart" are there;
docs/performance.md "The paper grind" and `docs/estimators.md` "Taken
appart" are not.
"""


@pytest.fixture
def broken_page(tmp_path) -> Page:
    path = tmp_path / "docs" / "broken.md"
    path.parent.mkdir()
    path.write_text(BROKEN_PAGE)
    return Page("docs/broken.md", path, BROKEN_PAGE)


def test_a_broken_command_fails(broken_page):
    problems = command_problems([broken_page])
    text = "\n".join(problems)
    print(text)
    assert "docs/broken.md:4: `cem-bench serch search_spaces/demo.yaml` does not parse: argument cmd: invalid " \
           "choice: 'serch' (choose from 'train', 'attack', 'search'," in text
    assert "docs/broken.md:5: `cem-bench search search_spaces/demo.yaml --gpus 2` does not parse: unrecognized " \
           "arguments: --gpus 2 (cem-bench search takes --name, --storage, --address, --num-samples, " in text
    assert "docs/broken.md:6: `cem-bench search search_spaces/nope.yaml`: search space 'search_spaces/nope.yaml' " \
           "does not exist in the repository (the spaces: search_spaces/attention_centroid.yaml" in text
    assert "docs/broken.md:7: `cem-bench train --set cem.lamda=8 --set train.amp=sometimes`: --set cem.lamda=8: " \
           "unknown config key 'cem.lamda' (did you mean cem.lambd" in text
    assert "docs/broken.md:7: `cem-bench train --set cem.lamda=8 --set train.amp=sometimes`: --set " \
           "train.amp=sometimes: train.amp: 'sometimes' is not allowed; allowed: str one of auto, on, off" in text
    assert "docs/broken.md:8: `cem-bench attack RUN_DIR --set cem.lambd=8`: cem-bench attack only changes " \
           "attack.* keys (and train.device, train.eval_batch_size); got cem.lambd" in text
    assert "docs/broken.md:9: `cem-bench search search_spaces/demo.yaml --num-samples 0` would stop before Ray " \
           "starts: num_samples: 0 must be an integer >= 1" in text
    assert "docs/broken.md:10: `make demoo`: no Makefile target 'demoo' (targets: " in text
    assert "docs/broken.md:14: `cem-bench search SPACE --mps sometimes` does not parse: argument --mps: invalid " \
           "choice: 'sometimes' (choose from 'auto', 'on', 'off')" in text
    assert "docs/broken.md:15: `cem-bench table RESULTS_DIR --xlsx` does not parse: unrecognized arguments: " \
           "--xlsx (cem-bench table takes --csv, --latex, --metrics)" in text
    assert len(problems) == 10, "the valid spans of line 13-14 pass"


def test_a_broken_key_fails(broken_page):
    problems = key_problems([broken_page])
    text = "\n".join(problems)
    print(text)
    assert "docs/broken.md:17: `cem.lambda`: unknown config key 'cem.lambda' (did you mean cem.lambd" in text
    assert "docs/broken.md:17: `train.ampp`: unknown config key 'train.ampp' (did you mean train.amp" in text
    assert "docs/broken.md:18: `cem.surrogate=slotcross`: cem.surrogate: unknown surrogate 'slotcross'; known: " \
           "attention_centroid, gated_attention, gmm, serial_enhanced, slot_cross" in text
    assert "docs/broken.md:19: cem.lamdba: unknown config key 'cem.lamdba' (did you mean cem.lambd" in text
    assert len(problems) == 4, "file names, Python names, error messages and the valid keys are not reported"


def test_a_broken_citation_fails(broken_page):
    problems = citation_problems([broken_page])
    text = "\n".join(problems)
    print(text)
    assert "docs/broken.md:45: cites docs/performance.md \"The paper grind\", which is neither a heading of it nor " \
           "the start of a bold run there (did you mean 'The paper grid'?)" in text
    assert "docs/broken.md:45: cites docs/estimators.md \"Taken appart\", which is neither a heading of it nor the " \
           "start of a bold run there (did you mean 'Taken apart" in text
    assert len(problems) == 2, "a heading and a bullet's bold lead are places; a name wrapped over lines is read whole"


def test_a_broken_path_fails(broken_page):
    problems = path_problems([broken_page])
    text = "\n".join(problems)
    print(text)
    assert "docs/broken.md:6: search_spaces/nope.yaml does not exist (did you mean search_spaces/demo.yaml" in text
    assert "docs/broken.md:21: docs/performence.md does not exist (did you mean docs/performance.md" in text
    assert "docs/broken.md:22: scripts/gpu_chek.py does not exist (did you mean scripts/gpu_check.py" in text
    assert "docs/broken.md:22: tests/test_docs.py::test_nothing_like_this: tests/test_docs.py has no test " \
           "test_nothing_like_this" in text
    assert "docs/broken.md:23: SURROGATES.md is not a file of the repository (looked in ., docs/, " \
           "search_spaces/)" in text
    assert "docs/broken.md:22: the link to 'docs/nowhere.md#x' leads nowhere: docs/docs/nowhere.md does not exist " \
           "(a link is relative to the page's folder)" in text
    assert "docs/broken.md:21: the link to 'docs/performance.md#gpu' leads nowhere: docs/docs/performance.md does " \
           "not exist (a link is relative to the page's folder) (did you mean performance.md?)" in text
    assert "docs/broken.md:23: searchr.py is not a module of the repository (did you mean searcher.py" in text
    assert len(problems) == 8, "outputs, placeholders and the paths that exist are not reported"


def test_a_broken_search_space_comment_fails(tmp_path):
    text = ("# Run it:\n#   cem-bench search search_spaces/demo.yaml --max-concurent 2\n"
            "name: x  # calibrate first (`cem-bench calibrate --set cem.lamda=8`, docs/nope.md)\n")
    page = Page("search_spaces/x.yaml", tmp_path / "x.yaml", text)
    problems = command_problems([page]) + path_problems([page])
    print("\n".join(problems))
    assert problems[:2] == [
        "search_spaces/x.yaml:2: `cem-bench search search_spaces/demo.yaml --max-concurent 2` does not parse: "
        "unrecognized arguments: --max-concurent 2 (cem-bench search takes --name, --storage, --address, "
        "--num-samples, --max-concurrent, --gpus-per-trial, --cpus-per-trial, --resume, --trust-pickled-state, "
        "--mps, --set, --dry-run)",
        "search_spaces/x.yaml:3: `cem-bench calibrate --set cem.lamda=8`: --set cem.lamda=8: unknown config key "
        "'cem.lamda' (did you mean cem.lambd, cem.margin? `cem-bench keys cem.` lists the keys)"]
    assert len(problems) == 3 and problems[2].startswith("search_spaces/x.yaml:3: docs/nope.md does not exist")


def test_a_broken_search_space_fails(broken_page, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nobjectives: [{metric: test_acc, mode: max}]\nparams: {cem.lambd: {choice: [8]}}\n")
    problems = space_problems([broken_page], [bad])
    text = "\n".join(problems)
    print(text)
    assert f"{bad}: does not validate: objectives: 1 objective(s) given; a frontier search needs 2 or 3" in text
    assert "docs/broken.md:27: the search space does not validate: params.cem.lambd.loguniform: empty range " \
           "[64, 1]" in text
    assert "docs/broken.md:41: the fragment (completed with a minimal space) does not validate: " \
           "baseline.replicates: -1" in text
    assert len(problems) == 3, "the marked fragment validates"


def test_a_figure_that_disagrees_fails(tmp_path):
    owner = Page("docs/performance.md", tmp_path / "p.md",
                 "The demo took **4 min 17 s** of wall time once `.venv` exists.\n"
                 "The paper grid needs 15.7 H100 GPU-hours run one at a time.")
    other = Page("README.md", tmp_path / "r.md",
                 "The demo took 4 min 17 s once `.venv` existed.\n\n"
                 "The grid is 16 GPU-hours run one at a time (rounded: fine),\n"
                 "or 17 GPU-hours run one at a time (not fine); `demo.yaml`: 11 trials.")
    figures = [f for f in FIGURES if f.name.startswith(("the demo's wall", "the paper grid's H100", "the demo's trials"))]
    problems = figure_problems([owner, other], figures)
    text = "\n".join(problems)
    print(text)
    assert "README.md:4: the paper grid's H100 GPU-hours, one trial at a time: states '17', but " \
           "docs/performance.md states '15.7' (line 2); state the owner's value or link to docs/performance.md " \
           "instead" in text
    assert "README.md:4: the demo's trials: states '11', but search_spaces/demo.yaml (its plan) gives '12'; " \
           "state what the space runs" in text
    assert len(problems) == 2
    page = Page("README.md", tmp_path / "r.md", "It prints `36 trials: 12 configurations x 3 seeds, 2 at a time` and\n"
                "`72 trials at most: 16 λ=0 baseline runs (5 cells x seeds 0, 1, 2), … 8 at a time`.")
    problems = banner_problems([page], sorted((ROOT / "search_spaces").glob("*.yaml")))
    print("\n".join(problems))
    assert len(problems) == 1 and problems[0].startswith(
        "README.md:2: `72 trials at most: 16 λ=0 baseline runs (5 cells x seeds 0, 1, 2) …` is not what `cem-bench "
        "search` prints for a shipped space or a space of this page; for search_spaces/")
    assert "it prints `72 trials at most: 15 λ=0 baseline runs (5 cells x seeds 0, 1, 2), 48 configurations" in problems[0]
    gone = figure_problems([Page("docs/performance.md", tmp_path / "p.md", "nothing"), other], figures[:1])
    assert gone and "the owner does not state it any more" in gone[0]


def test_value_agreement():
    v = parse_value
    assert agrees(v("1.34", "number"), v("1.34–1.36", "number"))
    assert not agrees(v("1.30", "number"), v("1.34–1.36", "number"))
    assert agrees(v("94", "number"), v("93.9", "number"))
    assert not agrees(v("93", "number"), v("93.9", "number"))
    assert agrees(v("4 min 17 s", "duration"), v("4 min 17 s", "duration"))
    assert not agrees(v("4 min 27 s", "duration"), v("4 min 17 s", "duration"))
    assert agrees(v("33–50 s", "duration"), v("33–50 s", "duration"))
    assert math.isclose(v("2.5 min", "duration").lo, 150)
