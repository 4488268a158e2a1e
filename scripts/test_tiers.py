"""`make test`: every test, as two pytest processes side by side.

One process runs the Ray tier (``-m ray``), then ``tests/test_cluster_autoscale.py`` in a process of its own
(its driver connects with ``RAY_AUTH_MODE=disabled``, which Ray keeps for the process: a later in-process local
cluster then fails its GCS's token check), then the tests of ``AFTER_RAY``. The other runs every other test, at
the lowest CPU priority (``nice 19``): the Ray tier spends much of its time waiting (processes starting,
checkpoints, signals, a killed driver) and the other tests fill those waits, while the Ray tier's trials run
about as they do alone, so its tests of timing-dependent paths (a driver killed once the scheduler has decided,
a signal after the first result) see the timings they were written for. Ray never runs twice at once: the tests
outside the tier start no Ray (tests/conftest.py fails one that leaves Ray running). The other tests run with
``OMP_WAIT_POLICY=PASSIVE``: a test that trains at 2 torch threads (``test_same_seed_same_history``) shares the
cores with the Ray tier at a lower priority, and OpenMP's default spin-wait at each parallel region's barrier
then burns the time the starved thread needs. docs/architecture.md 5.5 has the times measured.

The Ray tier's output is shown when it ends, not interleaved with the other's; the exit status is the first
non-zero one of the four processes (0 when all pass). Ctrl-C reaches all of them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

AUTOSCALE = "tests/test_cluster_autoscale.py"
# The longest test outside the Ray tier: at nice 19 it set the other tier's length, so it runs in the Ray tier's
# process after it, at normal priority (the times: docs/architecture.md 5.5).
AFTER_RAY = ("tests/test_cli.py::test_the_calibrated_defaults_hold_at_the_reference_state",)
RAY_SIDE = (("ray tier", ["-m", "ray", "--ignore", AUTOSCALE]), ("autoscale", [AUTOSCALE]),
            ("after the ray tier", list(AFTER_RAY)))


def _ray_tier(python: str, log, rcs: dict) -> None:
    for name, argv in RAY_SIDE:
        log.write(f"==== {name}: pytest {' '.join(argv)}\n")
        log.flush()
        rcs[name] = subprocess.call([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10",
                                     *argv], stdout=log, stderr=subprocess.STDOUT, env=RAY_ENV)


# Ray starts its workers at nice 15 (RAY_worker_niceness): against the other tier at nice 19 a trial had about
# 70 % of a contested core (CFS weights 36 to 15), not the whole of it that the tier's timings were written for
RAY_ENV = {**os.environ, "RAY_worker_niceness": os.environ.get("RAY_worker_niceness", "0")}


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):   # before either tier: pytest's help came after the Ray tier's run
        print(f"usage: python scripts/test_tiers.py [PYTEST OPTION ...]\n\n{__doc__.split(chr(10) * 2)[0]}\n\nThe "
              f"options go to the tests outside the Ray tier (pytest's own: python -m pytest --help).")
        return 0
    python = sys.executable
    rcs: dict[str, int] = {}
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        ray = threading.Thread(target=_ray_tier, args=(python, log, rcs), daemon=True)
        ray.start()
        rest = subprocess.Popen(["nice", "-n", "19", python, "-m", "pytest", "-q", "--durations=15", "-m", "not ray",
                                 "--ignore", AUTOSCALE, *(f"--deselect={t}" for t in AFTER_RAY), *argv],
                                env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        # Ctrl-C reaches every process of the terminal's group, the pytest processes included: wait for them
        rcs["the rest"] = rest.wait()
        ray.join()
        log.seek(0)
        sys.stdout.write(log.read())
    for name, _ in RAY_SIDE:   # a process that never started (the thread died) is a failure, not a pass
        rcs.setdefault(name, 1)
    bad = {k: v for k, v in rcs.items() if v}
    print(f"make test: {', '.join(f'{k} exit {v}' for k, v in rcs.items())}"
          + ("" if not bad else f"; failed: {', '.join(bad)}"))
    return next(iter(bad.values()), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
