"""Small inputs that used to exhaust memory, overflow the stack or pass silently (issue 39, items 4-8): each
class is refused before the memory is spent, in one paragraph naming the limit, with nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from conftest import alarm_after
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cem_bench.cli import main
from cem_bench.core import checkpoint
from cem_bench.errors import ResultsError, SpaceError
from cem_bench.parsing import MAX_DEPTH, MAX_DIGITS, ParseError, load_yaml, loads_json
from cem_bench.spaces import parse_space

BOMB = "\n".join([f"{a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]"
                  for p, a in zip([None, *"abcdefgh"], "abcdefghi")])


@pytest.fixture(autouse=True)
def bounded_time():
    yield from alarm_after(60, "something expanded what it should have refused")


# ---------------------------------------------------------------- the parsers
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(plain)
def test_ordinary_documents_read_as_the_libraries_read_them(doc):
    """The limits refuse nothing a configuration or a result would hold."""
    text = yaml.safe_dump(doc)
    assert load_yaml(text) == yaml.safe_load(text)
    text = json.dumps(doc)
    assert loads_json(text) == json.loads(text)


def test_an_alias_bomb_is_refused_before_it_is_expanded():
    with pytest.raises(ParseError, match="expands to more than 1,000,000 values"):
        load_yaml(BOMB)
    small = "a: &a [1, 2]\nb: [*a, *a]\n"        # aliases as people use them still work
    assert load_yaml(small) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 20_000])
def test_deep_nesting_is_refused(levels):
    with pytest.raises(ParseError, match="nested"):
        load_yaml("x: " + "[" * levels + "]" * levels)
    with pytest.raises(ParseError, match="nested"):
        loads_json("[" * 20_000 + "]" * 20_000)


@pytest.mark.parametrize("digits", [MAX_DIGITS + 1, 400, 5000])
def test_huge_integers_are_refused(digits):
    with pytest.raises(ParseError, match=f"{digits:,} digits|more than {MAX_DIGITS} digits"):
        load_yaml("train.epochs: " + "9" * digits)
    with pytest.raises(ParseError, match=f"more than {MAX_DIGITS} digits"):
        loads_json('{"epoch": ' + "9" * digits + "}")
    assert loads_json('{"text": "' + "9" * digits + '"}')["text"] == "9" * digits   # inside a string: text


def test_a_key_given_twice_is_refused_naming_both_lines():
    with pytest.raises(ParseError, match=r"'train.epochs' appears twice in one mapping \(line 1 and line 3\)"):
        load_yaml("train.epochs: 2\nseed: 0\ntrain.epochs: 3\n")
    assert load_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}   # same key, two mappings


def test_a_yaml_merge_key_is_read_as_yaml_reads_it():
    """`<<: *base` (YAML's merge key, which the safe loader takes) was refused as a tag "such as !!python/…" that
    the user never wrote (2026-12-07 probe): merged, a key of the mapping itself overriding the merged one; a key
    given twice in the mapping itself is still refused."""
    text = "base: &b {train.epochs: 4, seed: 1}\nrun:\n  <<: *b\n  seed: 7\n"
    assert load_yaml(text)["run"] == {"train.epochs": 4, "seed": 7}
    assert load_yaml("a: &a {x: 1}\nb: &b {y: 2}\nc: {<<: [*a, *b]}\n")["c"] == {"x": 1, "y": 2}
    with pytest.raises(ParseError, match="'seed' appears twice"):
        load_yaml(text + "  seed: 8\n")


# ---------------------------------------------------------------- the commands
def run_cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


@pytest.mark.parametrize("body, says", [
    (BOMB + "\ntrain.epochs: *i\n", "billion laughs"),
    ("train.epochs: " + "[" * 5000 + "]" * 5000, "nested"),
    ("train.epochs: " + "9" * 5000, "5,000 digits"),
    ("train.epochs: " + "9" * 400, "400 digits"),
    ("train.epochs: 2\ntrain.epochs: 3\n", "appears twice"),
    ("", "is empty"),                                   # not a run of every default (240 epochs)
    ("# only a comment\n", "is empty"),
    ("train: 5\n", "train: 5 is not a mapping; train is a section"),
    ("x: !!python/object/apply:os.system [\"true\"]\n", "without tags such as !!python/…; nothing in it was run"),
    ("cem: [lambd, 8]\n", "cem is a section: give its keys under it (cem: {lambd: ...})"),
])
def test_train_config_files_fail_in_one_short_paragraph(tmp_path, capsys, body, says):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(body)
    rc, out = run_cli(["train", "--config", str(cfg), "--out", str(tmp_path / "run")], capsys)
    assert rc == 2 and says in out and len(out) < 1000, out[:2000]
    assert not (tmp_path / "run").exists()


def test_a_search_space_bomb_is_a_space_error(tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text(BOMB + "\nname: x\n")
    with pytest.raises(SpaceError, match="billion laughs"):
        from cem_bench.spaces import load_space
        load_space(str(space))


def test_set_values_are_parsed_with_the_same_limits(tmp_path, capsys):
    rc, out = run_cli(["train", "--set", "attack.names=" + "[" * 5000 + "]" * 5000, "--out", str(tmp_path / "r")],
                      capsys)
    assert rc == 2 and "nested" in out and len(out) < 1000, out[:2000]
    rc, out = run_cli(["train", "--set", "train.epochs=" + "9" * 400, "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and "larger than any count" in out and len(out) < 1000, out[:2000]


def test_a_checkpoint_whose_config_is_a_bomb_fails_in_a_short_paragraph(tmp_path, capsys):
    import torch
    bomb = ["lol"] * 9
    for _ in range(9):
        bomb = [bomb] * 9      # 9^10 values as shared references, as torch.load rebuilds them
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(checkpoint.to_bytes({"train.epochs": bomb}, {"client": {"w": torch.zeros(1)}}))
    rc, out = run_cli(["attack", str(run)], capsys)
    assert rc == 2 and "train.epochs" in out and len(out) < 1000, out[:2000]


@pytest.mark.parametrize("special", ["fifo", "devzero"])
def test_a_checkpoint_that_is_a_pipe_or_a_device_is_refused(tmp_path, capsys, special):
    run = tmp_path / "run"
    run.mkdir()
    if special == "fifo":
        os.mkfifo(run / "checkpoint.pt")
    else:
        os.symlink("/dev/zero", run / "checkpoint.pt")
    rc, out = run_cli(["attack", str(run)], capsys)
    assert rc == 2 and ("named pipe" if special == "fifo" else "Remove the link") in out   # linked: refused as a link
    assert [p.name for p in run.iterdir()] == ["checkpoint.pt"]


def test_a_train_size_past_memory_is_refused_before_allocation(tmp_path, capsys):
    rc, out = run_cli(["train", "--set", "data.train_size=1000000000", "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and "data.train_size" in out and "5e+06" in out
    rc, out = run_cli(["train", "--set", "data.train_size=4000000", "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and "GiB" in out and "give at most" in out
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- plans that are too large or repeat themselves
def space(**over) -> dict:
    doc = {"name": "s", "objectives": [{"metric": "test_acc", "mode": "max"},
                                       {"metric": "attack_ssim", "mode": "min"}],
           "num_samples": 4, "params": {"cem.lambd": {"loguniform": [1, 64]}}, "fixed": {"train.epochs": 2}}
    doc.update(over)
    return doc


def test_a_grid_of_a_billion_cells_is_refused_without_building_it():
    params = {"cem.lambd": {"choice": list(range(1, 1001))},
              "defense.noise_std": {"choice": [0.001 * i for i in range(1, 1001)]},
              "attack.rmle_iterations": {"choice": list(range(1, 1001))}}
    with pytest.raises(SpaceError, match="1,000,000,000 cells"):
        parse_space(space(sampler={"name": "grid"}, num_samples=None, params=params))


def test_a_baseline_of_a_billion_cells_is_refused_without_building_it():
    params = {"cem.lambd": {"loguniform": [1, 64]},
              "defense.noise_std": {"choice": [0.001 * i for i in range(1, 1001)]},
              "attack.rmle_iterations": {"choice": list(range(1, 1001))},
              "attack.epochs": {"choice": list(range(1, 1001))}}
    with pytest.raises(SpaceError, match="1,000,000,000 cells"):
        parse_space(space(params=params, num_samples=10))


def test_more_samples_than_distinct_configurations_is_refused():
    with pytest.raises(SpaceError, match="only 2 distinct configurations"):
        parse_space(space(num_samples=3, params={"cem.lambd": {"choice": [8, 16]}}))
    with pytest.raises(SpaceError, match="only 3 distinct configurations"):
        parse_space(space(num_samples=4, params={"cem.num_clusters": {"int": [2, 4]}}))
    assert parse_space(space(num_samples=2, params={"cem.lambd": {"choice": [8, 16]}})).num_samples == 2
    assert parse_space(space(num_samples=50)).num_samples == 50        # a continuous range: no bound


def test_an_object_store_failure_names_its_reason(monkeypatch, capsys, tmp_path):
    """pyarrow's S3 errors carry no strerror: the CLI printed only 'cem-bench: OSError'."""
    from cem_bench import cli

    def unreachable(args):
        raise OSError("When resolving region for bucket 'b': AWS Error NETWORK_CONNECTION: Could not resolve "
                      "host: b.s3.amazonaws.com")
    parser = cli.make_parser()
    parser._subparsers._group_actions[0].choices["report"].set_defaults(func=unreachable)
    monkeypatch.setattr(cli, "make_parser", lambda: parser)
    rc, out = run_cli(["report", "s3://b/res", "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "Could not resolve host: b.s3.amazonaws.com" in out and len(out.splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["table", "ftp://host/x"],
    ["table", "gs:///x"],
    ["report", "http://example.com/x", "--out", "{tmp}/o"],
    ["search", "search_spaces/demo.yaml", "--storage", "ftp://host/x"],
])
def test_a_storage_pyarrow_cannot_open_is_one_line_naming_what_is_valid(argv, capsys, tmp_path, monkeypatch):
    """An unknown URI scheme (or one without its bucket) was a pyarrow traceback; now one line saying which
    storages are valid, before anything is written or started."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    rc, out = run_cli([a.format(tmp=tmp_path) for a in argv], capsys)
    assert rc == 2 and "not a storage cem-bench can use" in out and "s3://BUCKET/PREFIX" in out, out[-2000:]
    assert "Traceback" not in out and not (tmp_path / "o").exists()


_STATE = checkpoint.to_bytes({"seed": 0}, {"epoch": 1, "history": [], "client": {"w": torch.arange(6.0)}})


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.integers(0, len(_STATE) - 1).map(lambda n: _STATE[:n]),
                 st.tuples(st.integers(0, len(_STATE) - 1), st.integers(0, 255))
                 .map(lambda t: _STATE[:t[0]] + bytes([t[1]]) + _STATE[t[0] + 1:]),
                 st.tuples(st.sampled_from(b"jhqrgpJK"), st.binary(max_size=6)).map(lambda t: bytes([t[0]]) + t[1])))
@example(b"junk")   # a legacy (non-zip) pickle opening with LONG_BINGET, its 4-byte index cut short
@example(_STATE[:328] + bytes([81]) + _STATE[329:])   # a storage id made an int: torch raised AssertionError
@example(b"\x80\x41junkjunk")   # "pickle protocol 65": torch warned before failing (CI, 2026-12-06)
@example(_STATE[:328] + b"R" + _STATE[329:])          # REDUCE: torch warned "TypedStorage is deprecated" first
def test_any_bytes_as_a_checkpoint_are_read_or_refused_never_a_crash(data):
    """A trial's state.pt cut short or damaged (a copy interrupted, a full disk): a ResultsError naming the file,
    which resume and `cem-bench attack` report, never another exception (b"junk" once raised struct.error), and
    no warning above it (torch's "Detected pickle protocol 65 ... please file an issue" once was)."""
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            checkpoint.parse(data, "x/state.pt")
    except ResultsError as e:
        assert "x/state.pt" in str(e)
