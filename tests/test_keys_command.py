"""`cem-bench keys` is the reference of every configuration key: each key with its default (per surrogate, attack
or dataset where it depends on them, as ``resolve`` gives it), its allowed values, the plug-ins that read it, and
the registered surrogate and attack names."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from cem_bench import attacks, surrogates
from cem_bench.cli import main
from cem_bench.config import TrialConfig, key_specs

DATASETS = list(key_specs()["data.dataset"].choices)


def run_keys(capsys, *args) -> str:
    assert main(["keys", *args]) == 0
    return capsys.readouterr().out


def keys_json(capsys, *args) -> dict:
    return json.loads(run_keys(capsys, "--json", *args))


def by_name(doc: dict) -> dict:
    return {k["name"]: k for k in doc["keys"]}


def default_lines(text: str) -> dict[str, str]:
    """key -> what its "default:" line says."""
    out = {}
    for line in text.splitlines():
        head, sep, rest = line.partition(" default: ")
        if sep and head.strip() and not head.startswith(" "):
            out[head.strip()] = rest
    return out


def written(v) -> str:
    """A value as the text output writes it (as in a config file)."""
    if v is None:
        return "empty"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        short = f"{v:g}"
        return short if float(short) == v else repr(v)
    return str(v)


def surrogate_defaults() -> dict[str, dict]:
    """surrogate -> its resolved flat config (from_flat, as a trial builds it)."""
    return {s: surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": s})).to_flat() for s in surrogates.names()}


def attack_defaults() -> dict[tuple[str, str], dict]:
    """(attack, dataset) -> its resolved flat config."""
    return {(a, d): attacks.resolve(TrialConfig.from_flat({"attack.names": [a], "data.dataset": d})).to_flat()
            for a in attacks.names() for d in DATASETS}


def own_keys(flat: dict, section: str) -> set[str]:
    """The plug-in keys in a resolved flat config (those that are not keys of the section itself)."""
    return {k for k in flat if k.startswith(section + ".") and key_specs()[k].owners}


def test_json_lists_every_key_and_the_registered_names(capsys):
    doc = keys_json(capsys)
    assert doc["surrogates"] == surrogates.names()
    assert doc["attacks"] == attacks.names()
    assert doc["datasets"] == DATASETS
    assert [k["name"] for k in doc["keys"]] == list(key_specs())
    keys = by_name(doc)
    assert keys["cem.surrogate"]["choices"] == surrogates.names()
    assert keys["attack.names"]["choices"] == attacks.names()
    for k in doc["keys"]:
        assert {"name", "default", "defaults_by", "choices", "range", "applies_to", "help"} <= set(k)


def test_text_lists_every_key_and_the_registered_names(capsys):
    text = run_keys(capsys)
    assert list(default_lines(text)) == list(key_specs())
    assert f"surrogates (cem.surrogate): {', '.join(surrogates.names())}" in text
    assert f"attacks (attack.names): {', '.join(attacks.names())}" in text


def test_no_key_has_an_unexplained_empty_default(capsys):
    text = run_keys(capsys)
    for name, line in default_lines(text).items():
        assert "None" not in line, (name, line)
        if line.startswith("none"):        # no default at all: it says what an empty value means
            assert line.startswith("none (") and len(line) > len("none ()") + 5, (name, line)
    for k in keys_json(capsys)["keys"]:
        if k["default"] is None and k["defaults_by"] is None:
            assert k["note"], k["name"]
        if k["defaults_by"] is not None and None in k["defaults_by"].values():   # a plug-in leaves it empty:
            assert k["note"].startswith("empty = "), k["name"]                    # the listing says what that means


def test_surrogate_defaults_are_what_resolve_gives_for_every_surrogate(capsys):
    keys = by_name(keys_json(capsys))
    text = default_lines(run_keys(capsys))
    for s, flat in surrogate_defaults().items():
        for name in own_keys(flat, "cem"):           # every key the surrogate reads, with its value
            assert keys[name]["defaults_by"][s] == flat[name], (name, s)
            assert s in keys[name]["applies_to"]
            assert f"{s} {written(flat[name])}" in text[name], (name, s, text[name])
        for name in ("cem.loss_scale", "cem.grad_mode", "cem.warmup_epochs", "cem.estimator_fit"):
            assert keys[name]["defaults_by"][s] == flat[name], (name, s)
            assert f"{s} {written(flat[name])}" in text[name]
    for name, k in keys.items():                   # and no surrogate is listed for a key it does not read
        if k["kind"] == "surrogate" and k["applies_to"] and key_specs()[name].owners:
            assert set(k["applies_to"]) == {s for s, flat in surrogate_defaults().items() if name in flat}, name


def test_attack_defaults_are_what_resolve_gives_per_attack_and_dataset(capsys):
    keys = by_name(keys_json(capsys))
    text = default_lines(run_keys(capsys))
    resolved = attack_defaults()
    for a in attacks.names():
        for name in own_keys(resolved[(a, DATASETS[0])], "attack"):
            by_ds = {d: resolved[(a, d)][name] for d in DATASETS}
            shown = keys[name]["defaults_by"][a]
            if len(set(map(repr, by_ds.values()))) == 1:
                assert shown == by_ds[DATASETS[0]], name
                assert f"{a} {written(shown)}" in text[name]
            else:
                assert shown == by_ds, name
                assert "attack.names" in keys[name]["depends_on"] and "data.dataset" in keys[name]["depends_on"]
                assert f"{a} (" + ", ".join(f"{d} {written(v)}" for d, v in by_ds.items()) + ")" in text[name]


def test_every_listed_default_reads_back_as_the_value_the_code_uses(capsys):
    """The text listing wrote floats with 6 significant digits: slot_cross's cem.slot_temp showed as 3.36359 and
    rmle's attack.rmle_tv_weight as 151.789, so a default copied from the listing was not the default. Every
    number of a "default:" line, and of an "allowed:" range, now reads back exactly."""
    import re

    from cem_bench.config import MAX_SEED
    text = run_keys(capsys)
    lines = default_lines(text)
    flat = surrogate_defaults()["slot_cross"]
    assert f"slot_cross {flat['cem.slot_temp']!r}" in lines["cem.slot_temp"], lines["cem.slot_temp"]
    tv = attack_defaults()[("rmle", DATASETS[0])]["attack.rmle_tv_weight"]
    assert repr(tv) in lines["attack.rmle_tv_weight"], lines["attack.rmle_tv_weight"]
    assert f"int in [0, {MAX_SEED}]" in text
    for doc_key in keys_json(capsys)["keys"]:
        for v in (doc_key["defaults_by"] or {doc_key["name"]: doc_key["default"]}).values():
            for x in (v.values() if isinstance(v, dict) else [v]):
                if isinstance(x, float):
                    shown = re.findall(r"-?[0-9.]+(?:e[-+][0-9]+)?", lines[doc_key["name"]])
                    assert any(float(t) == x for t in shown if t not in (".", "-")), (doc_key["name"], x)


def test_the_issue_examples(capsys):
    """cem.num_slots per surrogate, the decoder's epochs per dataset: the values trials use."""
    text = default_lines(run_keys(capsys))
    flat = surrogate_defaults()
    assert f"slot_cross {flat['slot_cross']['cem.num_slots']}" in text["cem.num_slots"]
    assert f"serial_enhanced {flat['serial_enhanced']['cem.num_slots']}" in text["cem.num_slots"]
    assert "gmm" not in text["cem.num_slots"]
    res = attack_defaults()
    assert f"synthetic {res[('decoder', 'synthetic')]['attack.epochs']}" in text["attack.epochs"]
    assert f"cifar10 {res[('decoder', 'cifar10')]['attack.epochs']}" in text["attack.epochs"]


def test_one_surrogate_and_one_dataset(capsys):
    doc = keys_json(capsys, "--surrogate", "serial_enhanced", "--dataset", "cifar10", "cem.", "attack.epochs")
    keys = by_name(doc)
    flat = surrogate_defaults()["serial_enhanced"]
    assert set(keys) == ({k for k in flat if k.startswith("cem.")} | {"attack.epochs"})
    for name in own_keys(flat, "cem") | {"cem.loss_scale", "cem.warmup_epochs"}:
        assert keys[name]["defaults_by"] == {"serial_enhanced": flat[name]}
        assert keys[name]["default"] == flat[name]
    assert keys["attack.epochs"]["default"] == attack_defaults()[("decoder", "cifar10")]["attack.epochs"]
    text = run_keys(capsys, "--surrogate", "serial_enhanced", "num_slots")
    assert "cem.num_slots" in text and "slot_cross 8" not in text


@pytest.mark.parametrize("args, says", [(["--surrogate", "nope"], "unknown surrogate 'nope'"),
                                        (["--attack", "nope"], "unknown attack 'nope'"),
                                        (["--dataset", "mnist"], "unknown dataset 'mnist'"),
                                        (["no_such_key"], "no configuration key contains 'no_such_key'"),
                                        # a key only other plug-ins read exists: said so, and who reads it
                                        (["--surrogate", "gmm", "cem.num_slots"], "no key surrogate gmm reads "
                                         "contains 'cem.num_slots': cem.num_slots is read by attention_centroid, "
                                         "serial_enhanced, slot_cross"),
                                        (["--attack", "decoder", "rmle_iterations"],
                                         "attack.rmle_iterations is read by rmle"),
                                        # 2026-12-07 probe: the pattern that matched nothing was dropped, and an
                                        # empty name (an unset variable) listed every key
                                        (["cem.lambd", "zzz"], "no configuration key contains 'zzz' (the other "
                                         "pattern matched)"),
                                        (["--surrogate", ""], "unknown surrogate ''"),
                                        (["--attack", ""], "unknown attack ''"),
                                        # one of several patterns the chosen surrogate never reads was dropped, and
                                        # an empty pattern listed every key (2026-12-07 probe)
                                        (["--surrogate", "gmm", "cem.num_slots", "cem.lambd"], "no key surrogate gmm "
                                         "reads contains 'cem.num_slots': cem.num_slots is read by"),
                                        ([""], "an empty key pattern matches every key"),
                                        (["cem.lambd", " "], "an empty key pattern matches every key")])
def test_bad_filters_are_one_clear_error(args, says, capsys):
    assert main(["keys", *args]) == 2
    assert says in capsys.readouterr().err


def test_a_new_surrogate_shows_up_without_editing_the_command():
    """A surrogate registered beside the others (as a new file would be) is listed with its own defaults and
    keys: run in a fresh interpreter, so this session's registries stay as they are."""
    code = textwrap.dedent("""
        from dataclasses import dataclass
        from cem_bench import surrogates
        from cem_bench.keys import key
        from cem_bench.surrogates.gmm import GMM, GMMKeys

        @dataclass(frozen=True)
        class ProbeKeys(GMMKeys):
            probe_width: int = key(3, "a key only this surrogate has", lo=1)

        @surrogates.register("zz_probe")
        class Probe(GMM):
            Keys = ProbeKeys
            defaults = {"cem.loss_scale": 0.5, "cem.warmup_epochs": 7}

        from cem_bench.cli import main
        main(["keys", "--json"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    keys = by_name(doc)
    assert "zz_probe" in doc["surrogates"]
    assert keys["cem.loss_scale"]["defaults_by"]["zz_probe"] == 0.5
    assert keys["cem.warmup_epochs"]["defaults_by"]["zz_probe"] == 7
    assert keys["cem.probe_width"]["defaults_by"] == {"zz_probe": 3}
    assert keys["cem.num_clusters"]["defaults_by"] == {"gmm": 5, "zz_probe": 5}


# Each key a derived default is computed from, and a change of it (from a base) that changes the value: keys' rule.
DERIVED = {
    "cem.reg_strength": ("attention_centroid", [
        ({"cem.estimator_fit": "joint"}, "defense.noise_std", 0.1),
        ({"defense.noise_std": 0.1}, "cem.estimator_fit", "joint"),
        ({"cem.estimator_fit": "joint", "defense.noise_std": 0.0}, "cem.var_eps", 0.04),
    ]),
    "cem.slot_temp": ("slot_cross", [({}, "cem.hidden_dim", 256)]),
    "attack.rmle_tv_weight": ("rmle", [({}, "defense.noise_std", 0.1)]),
}


def test_a_derived_default_names_every_key_it_is_computed_from(capsys):
    """`keys --json` lists under depends_on the keys a derived default is computed from (cem.reg_strength listed
    cem.surrogate alone, yet is the noise σ under the joint fit): each listed key changes the value resolve gives,
    and every derived key is covered here, so a new one must say what it is derived from."""
    keys = by_name(keys_json(capsys))
    derived = {n for n, k in keys.items() if (k.get("note") or "").startswith("derived from ")}
    assert derived == set(DERIVED)
    for n, (plugin, cases) in DERIVED.items():
        chooser = "cem.surrogate" if n.startswith("cem.") else "attack.names"
        assert set(keys[n]["depends_on"]) == {chooser} | {k for _, k, _ in cases}, n
        assert all(k in keys[n]["note"] for _, k, _ in cases), n          # and the listing says which
        for base, k, v in cases:
            assert derived_value(n, plugin, {**base, k: v}) != derived_value(n, plugin, base), (n, k)


def derived_value(name: str, plugin: str, flat: dict):
    section, field = name.split(".", 1)
    if section == "cem":
        return surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": plugin, **flat})).cem.params[field]
    return attacks.resolve(TrialConfig.from_flat({"attack.names": [plugin], **flat})).attack.params[field]
