"""`make test`: every test, as two pytest processes side by side.

One process runs the Ray tier (``-m ray``), then ``tests/test_cluster_autoscale.py`` in a process of its own
(its driver connects with ``RAY_AUTH_MODE=disabled``, which Ray keeps for the process: a later in-process local
cluster then fails its GCS's token check). The other runs every other test. Ray never runs twice at once, and the
tests outside the Ray tier start no Ray (tests/conftest.py fails one that leaves Ray running), so the two share
nothing but the machine. Run one after the other they took 37 min 9 s of pytest on the 2-core machine on a slow day
(2026-11-28, docs/architecture.md 5.5): the Ray tier spends much of its time waiting on processes starting,
checkpoints and signals, which the other tier's CPU-bound tests fill.

The Ray tier's output is shown when it ends, not interleaved with the other's; the exit status is the first
non-zero one of the three processes (0 when all pass). Ctrl-C stops all of them."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading

AUTOSCALE = "tests/test_cluster_autoscale.py"


def _ray_tier(python: str, log, rcs: dict) -> None:
    for name, argv in (("ray tier", ["-m", "ray", "--ignore", AUTOSCALE]), ("autoscale", [AUTOSCALE])):
        log.write(f"==== {name}: pytest {' '.join(argv)}\n")
        log.flush()
        rcs[name] = subprocess.call([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10",
                                     *argv], stdout=log, stderr=subprocess.STDOUT)


def main(argv: list[str]) -> int:
    python = sys.executable
    rcs: dict[str, int] = {}
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        ray = threading.Thread(target=_ray_tier, args=(python, log, rcs), daemon=True)
        ray.start()
        rest = subprocess.Popen([python, "-m", "pytest", "-q", "--durations=15", "-m", "not ray", "--ignore",
                                 AUTOSCALE, *argv])
        # Ctrl-C reaches every process of the terminal's group, the pytest processes included: wait for them
        rcs["the rest"] = rest.wait()
        ray.join()
        log.seek(0)
        sys.stdout.write(log.read())
    bad = {k: v for k, v in rcs.items() if v}
    print(f"make test: {', '.join(f'{k} exit {v}' for k, v in rcs.items())}"
          + ("" if not bad else f"; failed: {', '.join(bad)}"))
    return next(iter(bad.values()), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
