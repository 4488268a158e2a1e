"""scripts/lambda_states.py: a state file is reused only for the arguments it was measured for. `cem-bench
calibrate` itself is replaced by a stand-in that writes its --json (the measurement has its own tests)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from cem_bench import calibrate


@pytest.fixture(scope="module")
def states():
    spec = importlib.util.spec_from_file_location(
        "lambda_states_under_test", Path(__file__).resolve().parent.parent / "scripts" / "lambda_states.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(warmups) -> list[dict]:
    """calibrate's records for gmm and slot_cross at each warm-up (built by hand: no training)."""
    rows = []
    for w in warmups:
        rows += [calibrate.Strength("gmm", 1.0, 1.0, "inject", 0.1, (1.0,), w, (1.0,), (1.0,), (1.0,)),
                 calibrate.Strength("slot_cross", 2.0, 0.93, "inject", 0.1, (2.0,), w, (1.1,), (1.2,), (0.5,),
                                    "matched", 3)]
    return calibrate.table(rows)


@pytest.fixture
def calls(states, monkeypatch):
    """The calibrate commands run; each writes a --json as calibrate does."""
    made = []

    def fake_run(cmd, check, stdout):
        made.append(cmd)
        warmups = [int(a) for a in cmd[cmd.index("--warmup") + 1:] if a.isdigit()]
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"configuration": {}, "records": records(warmups)}))
    monkeypatch.setattr(states.subprocess, "run", fake_run)
    return made


def args(out, **kw):
    return SimpleNamespace(**{"out": str(out), "datasets": ["synthetic"], "widths": [0.25], "sigmas": [0.1],
                              "warmups": [2, 3], "seeds": [0, 1], "batches": 8, "set": [], "redo": False, **kw})


def test_a_state_file_measured_for_other_arguments_is_refused_before_any_work_or_redone(states, calls, tmp_path):
    """A file measured at --batches 8 was taken for a --batches 4 run's (and a --warmups or --set one's) without
    a word; now every file is checked first, refused with what differs, or measured again with --redo."""
    states.run(args(tmp_path))
    assert len(calls) == 2
    f0, f1 = tmp_path / "synthetic_w0.25_s0.1_seed0.json", tmp_path / "synthetic_w0.25_s0.1_seed1.json"
    assert json.loads(f0.read_text())["lambda_states"]["batches"] == 8
    states.run(args(tmp_path))                                  # the same arguments: both reused
    assert len(calls) == 2
    f1.write_text(json.dumps(records([2, 3])))                  # a file from before the arguments were stored
    for changed, says in (({"batches": 4}, "batches 8 (now 4)"), ({"warmups": [2, 3, 5]}, "warmups [2, 3] (now"),
                          ({"set": ["cem.strength_batches=8"]}, "set [] (now ['cem.strength_batches=8'])")):
        with pytest.raises(SystemExit) as e:
            states.run(args(tmp_path, **changed))
        assert f"{f0}: {says}" in str(e.value) and f"{f1}: no arguments stored" in str(e.value), str(e.value)
        assert "--redo" in str(e.value) and len(calls) == 2
    states.run(args(tmp_path, batches=4, redo=True))
    assert len(calls) == 4 and all(json.loads(f.read_text())["lambda_states"]["batches"] == 4 for f in (f0, f1))


def test_the_summary_reads_calibrate_s_files_with_and_without_the_configuration(states, tmp_path, capsys):
    (tmp_path / "synthetic_w0.25_s0.1_seed0.json").write_text(json.dumps(records([2, 3])))
    (tmp_path / "synthetic_w0.25_s0.1_seed1.json").write_text(
        json.dumps({"configuration": {}, "records": records([2, 3]), "lambda_states": {}}))
    states.summarise(args(tmp_path))
    out = capsys.readouterr().out
    assert "| synthetic | 0.25 | 0.1 | 2 | slot_cross | 2.00 ×/÷ 1.00 | 1.10 ×/÷ 1.00 | 1.20 | 2 |" in out, out


def test_the_summary_refuses_files_measured_with_other_arguments(states, calls, tmp_path):
    """A second run into the same --out with other warm-ups was summarised with the first: its rows sat under
    "drift from warm-up 1" though they started at 2, and out of the compact table."""
    states.run(args(tmp_path, sigmas=[0.1], warmups=[1, 3]))
    states.run(args(tmp_path, sigmas=[0.15], warmups=[2, 4]))
    with pytest.raises(SystemExit) as e:
        states.summarise(args(tmp_path))
    assert "were measured with different arguments" in str(e.value) and "another --out" in str(e.value)


def test_the_doc_s_width_and_schedule_ranges_are_its_table_s():
    """docs/estimators.md "What it says" quoted 1.2–2.5× at σ 0.025–0.1 where its own table gives 4.8 and 5.2 at
    σ 0.025, and 4.6–5.3× for the fused pair, which only attention_centroid's column gives. The ranges are read
    from the table (the fixed default's ratio to gmm, in brackets) and must be the ones the text quotes."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "estimators.md").read_text()
    head = next(line for line in text.splitlines() if line.startswith("| data set | width | σ | seeds |"))
    names = [c.split(":")[0].strip() for c in head.strip("|").split("|")[4:]]
    cells = {}
    for line in text.split(head, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        dataset, width, sigma, _, *rest = [c.strip() for c in line.strip("|").split("|")]
        for name, cell in zip(names, rest):
            cells[dataset, float(width), float(sigma), name] = float(cell.rsplit("(", 1)[1].rstrip(")"))

    def span(surrogates, widths, sigmas=None):
        """min–max of the synthetic shapes' cells of ``surrogates`` at ``widths`` (and ``sigmas``), as printed."""
        values = [v for (d, w, s, n), v in cells.items() if d == "synthetic" and n in surrogates and w in widths
                  and (sigmas is None or s in sigmas)]
        return f"{min(values):.2g}–{max(values):.2g}×"
    inject = ("gated_attention", "slot_cross")
    sentence = " ".join(text.split("What moves it,", 1)[1].split("the **data set**", 1)[0].split())
    quoted = [span(inject, [1.0], [0.025]) + " at σ 0.025", span(inject, [1.0], [0.05, 0.1]) + " at σ 0.05–0.1",
              span(inject, [1.0], [0.15]) + " at σ 0.15", span(inject, [0.25]) + " at width 0.25",
              "attention_centroid pulls " + span(("attention_centroid",), [0.25, 1.0]),
              "serial_enhanced " + span(("serial_enhanced",), [0.25, 1.0])]
    assert span(inject, [1.0], [0.01]) == "20–20×" and "pull 20× gmm at width 1.0, σ 0.01" in sentence
    for q in quoted:
        assert q in sentence, (q, sentence)


@pytest.mark.parametrize("changed, says", [
    ({"datasets": ["nosuch"]}, "the state nosuch_w0.25_s0.1_seed0: data.dataset: 'nosuch' is not allowed"),
    ({"widths": [0.25, -1.0]}, "the state synthetic_w-1.0_s0.1_seed0: model.width: -1.0 is out of range"),
    ({"set": ["foo.bar=1"]}, "unknown config key 'foo.bar'"),
    ({"set": ["model.width=0.5"]}, "--set model.width: the script sets it for each state"),
    ({"warmups": [2, 9999]}, "warm-up 9999 leaves no CEM epoch"),
    # a data set calibrate would refuse failed inside its first calibrate, after the data sets before it; here
    # data.root names CIFAR-10's batch folder itself (refused without a download: the test is offline anywhere)
    ({"datasets": ["synthetic", "cifar10"], "set": ["data.root={tmp}/cifar-10-batches-py"]},
     "data.dataset=cifar10: data.root="),
])
def test_a_state_calibrate_refuses_is_refused_before_any_is_measured(states, calls, tmp_path, changed, says):
    """A data set, width or key calibrate refuses failed when its state's turn came, after the states before it,
    in a CalledProcessError traceback; --out was made first. Now every state is checked before the first runs."""
    out = tmp_path / "out"
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "batches.meta").write_bytes(b"")
    changed = {k: [v.format(tmp=tmp_path) for v in vs] if k == "set" else vs for k, vs in changed.items()}
    with pytest.raises(SystemExit) as e:
        states.run(args(out, **changed))
    assert says in str(e.value) and "Nothing was measured" in str(e.value), str(e.value)
    assert calls == [] and not out.exists()


def test_a_failed_calibrate_or_a_damaged_file_is_named_not_a_traceback(states, monkeypatch, tmp_path):
    import subprocess

    def failing(cmd, check, stdout):
        raise subprocess.CalledProcessError(3, cmd)
    monkeypatch.setattr(states.subprocess, "run", failing)
    with pytest.raises(SystemExit) as e:
        states.run(args(tmp_path))
    assert "calibrate failed for synthetic_w0.25_s0.1_seed0.json (exit 3" in str(e.value), str(e.value)
    (tmp_path / "synthetic_w0.25_s0.1_seed0.json").write_text("{cut short")
    for call in (states.summarise, states.run):
        with pytest.raises(SystemExit) as e:
            call(args(tmp_path))
        assert f"{tmp_path / 'synthetic_w0.25_s0.1_seed0.json'} is not a readable state file" in str(e.value)


@pytest.mark.parametrize("argv, says", [
    (["--out", "{f}"], "--out {f} is a file; give a folder"),
    (["--out", "{d}/none", "--summarise"], "--out {d}/none does not exist"),
    (["--out", "{d}/o", "--seeds", "1", "1"], "--seeds: 1 given more than once"),
    (["--out", "{d}/o", "--warmups", "2", "3", "2"], "--warmups: 2 given more than once"),
    (["--out", "{d}/o", "--batches", "0"], "--batches: '0' is not a whole number >= 1"),
    (["--out", ""], "--out: an empty path (an unset variable?)"),     # measured into the current folder (2026-12-07)
])
def test_the_arguments_are_refused_with_their_name(states, calls, tmp_path, monkeypatch, capsys, argv, says):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(states.sys, "argv", ["lambda_states.py"] + [a.format(f=tmp_path / "afile", d=tmp_path)
                                                                     for a in argv])
    with pytest.raises(SystemExit) as e:
        states.main()
    assert e.value.code == 2 and says.format(f=tmp_path / "afile", d=tmp_path) in capsys.readouterr().err
    assert calls == [] and not (tmp_path / "o").exists()
