"""Sampler plug-ins (cem_bench/spaces/samplers/): one file each; a new one is a file plus its test, shown here
by registering a throw-away sampler that the parser validates and make_sampler builds without other edits."""

from __future__ import annotations

import pytest

from cem_bench.errors import SpaceError
from cem_bench.spaces import parse_space, samplers
from cem_bench.spaces.sampling import make_sampler

SPACE = {"name": "s", "objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}],
         "num_samples": 4, "params": {"cem.lambd": {"loguniform": [1, 64]}}}


def test_the_shipped_samplers_are_the_package_files():
    assert samplers.names() == ("gp", "grid", "nsga2", "nsga3", "random", "tpe")
    for name in samplers.names():
        assert samplers.get(name).doc, name   # each says what it is


@pytest.fixture
def qmc():
    """A throw-away plug-in: Optuna's quasi-Monte-Carlo sampler with one option."""
    @samplers.register("qmc_test", {"scramble": ("true or false", lambda v: isinstance(v, bool))}, doc="test")
    def build(optuna, spec, opts):
        return optuna.samplers.QMCSampler(seed=0, **opts)
    yield
    samplers.unregister("qmc_test")


def test_a_new_sampler_is_one_registration(qmc):
    spec = parse_space({**SPACE, "sampler": {"name": "qmc_test", "scramble": True}})
    import optuna
    assert isinstance(make_sampler(spec), optuna.samplers.QMCSampler)
    with pytest.raises(SpaceError, match="sampler.scramble: 'yes' must be true or false"):
        parse_space({**SPACE, "sampler": {"name": "qmc_test", "scramble": "yes"}})
    with pytest.raises(SpaceError, match="unknown option of sampler 'qmc_test'; known: scramble"):
        parse_space({**SPACE, "sampler": {"name": "qmc_test", "seed": 1}})


def test_an_unknown_sampler_lists_the_registered_ones():
    with pytest.raises(SpaceError, match="unknown sampler 'cmaes'; known: gp, grid, nsga2, nsga3, random, tpe"):
        parse_space({**SPACE, "sampler": {"name": "cmaes"}})


def test_each_shipped_sampler_builds():
    import optuna
    for name, extra in (("tpe", {}), ("nsga2", {}), ("nsga3", {}), ("gp", {}), ("random", {"seed": 1})):
        spec = parse_space({**SPACE, "sampler": {"name": name, **extra}})
        assert isinstance(make_sampler(spec), optuna.samplers.BaseSampler), name
