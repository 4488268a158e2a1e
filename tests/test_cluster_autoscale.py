"""Autoscaling from cluster.yaml's node types with Ray's fake multi-node provider (issue 38 item 1).

`provider: type: fake_multinode` is the provider of Ray's own autoscaler tests: its autoscaler (the monitor
process of the head, autoscaler v1, Ray 2.60's default) starts a worker node as local processes (a raylet and
its agents, `ray._private.node.Node`) with the resources its node type declares, GPUs as counted (logical)
resources, and stops it when it has been idle for `idle_timeout_minutes`. The configuration is built here from
cluster.yaml: its head type's resources (CPU 0: no trial on the head), its worker type (name, min/max workers),
the worker's resources (the instance type's CPUs and GPUs, read from the comment beside it in cluster.yaml,
since on AWS Ray reads them from EC2; a `resources:` entry in the file wins, as on AWS), its upscaling speed.
Scaled down for one machine, and said where: at most MAX_WORKERS workers (cluster.yaml: 8), an idle timeout of
IDLE_MINUTES (cluster.yaml: 10), an object store of OBJECT_STORE bytes per node.

Ray's `ray.cluster_utils.AutoscalingCluster` is not used: it reads `fake_multi_node/example.yaml`, which the
2.60 wheel does not ship (FileNotFoundError), and its start and shutdown run `ray stop --force`, which ends
every Ray process of the machine, not only its own. The head here is a `ray start --head --block` in its own
process group with its own `--temp-dir`; the end of the module stops the processes it started (its process
tree, and whatever runs with that temp dir in its command line: the fake workers' raylets and workers).

Each test runs one tiny search through `cem-bench search --address` with the `resources` of the shipped spaces
(two tests: of the distinct `resources` in search_spaces/*.yaml, the one with a GPU share and the CPU-only one
that claim the most trials per worker, ``RUN_SHAPES``; every shape's claim is checked against cluster.yaml by
`test_claims_match_cluster_yaml_and_the_spaces`), 2k trials where k is the claimed trials per worker,
all allowed at once, from zero workers, and checks: workers start only once the driver's trials wait; two start
(the autoscaler bin-packs the waiting trials by the node type's resources; a spare that Ray's autoscaler launches
in a race and ends at once as "max_workers_per_type" is reported, not counted); at one moment Ray held all 2k
trials' CPUs and GPUs on those two workers, so each held k (a worker holds at most k); no trial ran on the head;
every trial ran once, ok, never retried; both workers end as "idle" (the autoscaler's own reason, from its log).
Measured numbers are printed (`pytest -s`) and recorded in docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pytest
import yaml
from test_search import RAY_BIN, _free_port, hooks_cmd, hooks_env, subprocess_env, write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
SPACES = ROOT / "search_spaces"

MAX_WORKERS = 2            # cluster.yaml allows 8; two show that the autoscaler counts nodes, not only that it starts one
IDLE_MINUTES = 0.1         # cluster.yaml: 10 minutes
OBJECT_STORE = 100 * 2**20  # bytes per node (Ray's default takes 30% of memory per node)
RELEASE_AFTER_S = 240      # the held trials go on after this even if the test never saw all 2k held at once
FAKE_HEAD_TYPE = "ray.head.default"   # the fake provider tags its head with this node type name

# What the spaces' comments and docs/cluster.md claim about a g5.xlarge worker of cluster.yaml (4 vCPU, 1 GPU):
# {cpu: 1, gpu: 0.25}: "4 trials per GPU" (gmm.yaml, slot_cross.yaml, ...; docs/cluster.md: "32 fills the 8
# workers at 4 trials each"); {cpu: 2, gpu: 0.5}: "2 trials per GPU ... holds 2 by its CPUs as by its GPU"
# (cifar10_paper.yaml); {cpu: 1, gpu: 0}: CPU only, 4 by the worker's 4 CPUs (docs/cluster.md); {cpu: 2, gpu: 0}
# (threads_digits.yaml, 2 torch threads a trial): 2 by its CPUs.
CLAIMED_PER_WORKER = {(1.0, 0.25): 4, (2.0, 0.5): 2, (1.0, 0.0): 4, (2.0, 0.0): 2}

# the tiny trial of test_search at its smallest: these tests are about where trials run, not what they compute
FIXED = {"data.train_size": 128, "data.test_size": 64, "train.epochs": 2, "attack.rmle_iterations": 5}


# ------------------------------------------------------------------------------------ from the files
def shipped_resources() -> dict[tuple[float, float], list[str]]:
    """The distinct ``resources`` of search_spaces/*.yaml, each with the spaces that use it."""
    shapes: dict[tuple[float, float], list[str]] = {}
    for path in sorted(SPACES.glob("*.yaml")):
        res = yaml.safe_load(path.read_text()).get("resources") or {}
        shapes.setdefault((float(res.get("cpu", 1)), float(res.get("gpu", 0))), []).append(path.name)
    return shapes


SHAPES = shipped_resources()


def run_shapes(shapes) -> list[tuple[float, float]]:
    """Of ``shapes``, the one with a GPU share and the CPU-only one that claim the most trials per worker (fewer
    CPUs a trial on a tie). The others pack by the same rule with fewer trials: a search each would test the same
    mechanism at a smaller count, for a minute or more of CI each (docs/architecture.md 5.5)."""
    out = []
    for gpu_share in (True, False):
        kind = [sh for sh in shapes if (sh[1] > 0) == gpu_share]
        if kind:
            out.append(max(kind, key=lambda sh: (CLAIMED_PER_WORKER.get(sh, 0), -sh[0])))
    return out


RUN_SHAPES = run_shapes(SHAPES)


def instance_resources(cluster_text: str, instance_type: str) -> dict:
    """CPU and GPU of ``instance_type`` as cluster.yaml's comment states them ("g5.xlarge: 4 vCPU, 1 A10G ...").
    On AWS Ray asks EC2 (describe_instance_types); the comment is what the file says Ray will find."""
    m = re.search(rf"{re.escape(instance_type)}: (\d+) vCPU, (\d+) ", cluster_text)
    assert m, f"cluster.yaml does not state the vCPUs and GPUs of {instance_type} ('{instance_type}: N vCPU, M GPU')"
    return {"CPU": int(m.group(1)), "GPU": int(m.group(2))}


def fake_cluster_config(gcs_address: str) -> tuple[dict, dict]:
    """(the fake_multinode autoscaling config, the head's resources), built from cluster.yaml."""
    text = CLUSTER_YAML.read_text()
    doc = yaml.safe_load(text)
    types = doc["available_node_types"]
    head = dict(types[doc["head_node_type"]].get("resources") or {})
    workers = {}
    for name, t in types.items():
        if name == doc["head_node_type"]:
            continue
        res = {**instance_resources(text, t["node_config"]["InstanceType"]), **(t.get("resources") or {})}
        workers[name] = {"resources": {**res, "object_store_memory": OBJECT_STORE}, "node_config": {},
                         "min_workers": t.get("min_workers", 0), "max_workers": min(t["max_workers"], MAX_WORKERS)}
    config = {
        "cluster_name": doc["cluster_name"],
        "max_workers": min(doc["max_workers"], MAX_WORKERS),
        "upscaling_speed": doc.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": IDLE_MINUTES,
        # what the wheel's missing example.yaml held, plus: launch_multiple (the provider otherwise starts one
        # node per launch, whatever the count asked) and the GCS address (it otherwise assumes port 6379)
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "launch_multiple": True, "gcs_address": gcs_address},
        "available_node_types": {FAKE_HEAD_TYPE: {"resources": head, "node_config": {}, "max_workers": 0}, **workers},
        "head_node_type": FAKE_HEAD_TYPE,
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }
    return config, head


def per_worker(config: dict, cpu: float, gpu: float) -> int:
    """Trials of ``{cpu, gpu}`` that fit one worker of ``config`` (its only worker type)."""
    (res,) = [t["resources"] for n, t in config["available_node_types"].items() if n != FAKE_HEAD_TYPE]
    fit = math.floor(res.get("CPU", 0) / cpu + 1e-9)
    if gpu > 0:
        fit = min(fit, math.floor(res.get("GPU", 0) / gpu + 1e-9))
    return fit


# ------------------------------------------------------------------------------------ the cluster
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def _ours(root: int, mark: str) -> set[int]:
    """The process tree under ``root`` and every process whose command line holds ``mark`` (our temp dir)."""
    kids, found, todo = _children(), set(), [root]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(kids.get(p, []))
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if mark.encode() in (d / "cmdline").read_bytes():
                    found.add(int(d.name))
    found.discard(os.getpid())
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


class Cluster(NamedTuple):
    address: str
    config: dict
    temp_dir: str
    started_s: float     # `ray start --head` until the head is up

    def _log(self) -> str:
        logs = Path(self.temp_dir).glob("session_*/logs/monitor.log")   # session_latest is a link to the session
        return "".join(p.read_text(errors="replace") for p in logs if not p.parents[1].is_symlink())

    def events(self, since: float) -> list[str]:
        """The autoscaler's event summary ("Adding 2 node(s) of type gpu_worker.", ...) from ``since`` on."""
        out = []
        for line in self._log().splitlines():
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+).*:event_summary:(.*)", line)
            if m and time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000 >= since - 1:
                out.append(f"{m.group(1)[11:]} {m.group(3)}")
        return out

    def terminations(self) -> dict[str, str]:
        """{node id: why} of every worker the autoscaler ended ("idle", "max_workers_per_type", ...)."""
        return dict(re.findall(r"Terminating the node with id (\w+) and ip \S+ \((\w+)\)", self._log()))

    def monitor_log(self, tail: int = 4000) -> str:
        """The end of the autoscaler's logs (for failure messages)."""
        logs = sorted(Path(self.temp_dir).glob("session_*/logs/monitor.[le]*"))   # .log, .err
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in logs
                         if p.stat().st_size and not p.parents[1].is_symlink())


@contextlib.contextmanager
def start_cluster():
    """A head started with the fake_multinode autoscaling config built from cluster.yaml, no worker, and this
    process connected to it as a driver (to read the node table). At the end every process it started is ended."""
    import ray
    from ray.util import get_node_ip_address  # public: ray.util re-exports it
    port = _free_port()
    config, head = fake_cluster_config(f"{get_node_ip_address()}:{port}")
    temp_dir = tempfile.mkdtemp(prefix="cemas-", dir="/tmp")   # short: Ray's socket paths live under it
    cfg_path = Path(temp_dir) / "autoscaling.json"
    cfg_path.write_text(json.dumps(config))
    env = {**subprocess_env(), "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    head_log = Path(temp_dir) / "head.log"
    log = open(head_log, "wb")
    t0 = time.time()
    proc = subprocess.Popen(
        [RAY_BIN, "start", "--head", f"--port={port}", f"--num-cpus={head.get('CPU', 0)}",
         f"--num-gpus={head.get('GPU', 0)}", f"--object-store-memory={OBJECT_STORE}", f"--temp-dir={temp_dir}",
         f"--autoscaling-config={cfg_path}", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"   # as every process of this cluster
    try:
        deadline = time.time() + 90
        while "Ray runtime started" not in head_log.read_text(errors="replace"):
            assert proc.poll() is None and time.time() < deadline, head_log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        address = f"127.0.0.1:{port}"
        ray.init(address=address, log_to_driver=False)
        yield Cluster(address, config, temp_dir, time.time() - t0)
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
        pids = _ours(proc.pid, temp_dir)
        _signal_all(pids, signal.SIGTERM)
        deadline = time.time() + 5
        while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
            proc.poll()
        _signal_all(pids | _ours(proc.pid, temp_dir), signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 10   # killed processes are gone before the next module starts its Ray
        while _ours(proc.pid, temp_dir) - {proc.pid} and time.time() < deadline:
            time.sleep(0.2)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def autoscaling_cluster():
    with start_cluster() as cluster:
        yield cluster


def worker_nodes() -> dict[str, bool]:
    """{node id: alive} of every worker node the cluster has had (the head, where this driver runs, left out)."""
    import ray
    head = ray.get_runtime_context().get_node_id()
    return {n["NodeID"]: bool(n["Alive"]) for n in ray.nodes() if n["NodeID"] != head}


def reserved() -> tuple[float, float]:
    """(CPUs, GPUs) the trials' placement groups hold now (the head has none): one read of the placement group
    table. (Total minus available resources took two reads: a spare node removed between them counted its free
    CPUs as held, a peak the trials never reached.)"""
    import ray.util
    cpu = gpu = 0.0
    for group in ray.util.placement_group_table().values():
        if group.get("state") == "CREATED":
            for bundle in group.get("bundles", {}).values():
                cpu += bundle.get("CPU", 0.0)
                gpu += bundle.get("GPU", 0.0)
    return cpu, gpu


def peak_at_once(spans: list[tuple[pd.Timestamp, pd.Timestamp]]) -> int:
    """The most spans open at one time (a span ending at the second another starts does not overlap it)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    return peak


# ------------------------------------------------------------------------------------ the tests
def test_claims_match_cluster_yaml_and_the_spaces():
    """Every shipped resources has a claim; the claim is what fits a worker of cluster.yaml; a space comment
    that says "N trials per GPU" says the claim."""
    config, head = fake_cluster_config("127.0.0.1:1")
    assert head == {"CPU": 0}
    assert set(SHAPES) <= set(CLAIMED_PER_WORKER), f"resources without a claim here: {set(SHAPES) - set(CLAIMED_PER_WORKER)}"
    for (cpu, gpu), claim in CLAIMED_PER_WORKER.items():
        assert per_worker(config, cpu, gpu) == claim, (cpu, gpu, config["available_node_types"])
    for (cpu, gpu), names in SHAPES.items():
        for name in names:
            said = re.findall(r"(\d+) trials per GPU", (SPACES / name).read_text())
            assert all(int(n) == CLAIMED_PER_WORKER[(cpu, gpu)] for n in said), (name, said)


@pytest.mark.parametrize("shape", RUN_SHAPES, ids=lambda s: f"cpu{s[0]:g}-gpu{s[1]:g}")
def test_workers_start_on_demand_pack_as_claimed_and_end_when_idle(tmp_path, autoscaling_cluster, shape):
    cluster = autoscaling_cluster
    cpu, gpu = shape
    k = CLAIMED_PER_WORKER[shape]
    n = 2 * k                           # two workers' worth of trials, all allowed at once
    t_test = time.time()
    # from zero workers: the previous test's workers are gone (idle) before this one starts
    deadline = time.time() + 60
    while any(worker_nodes().values()):
        assert time.time() < deadline, (worker_nodes(), cluster.monitor_log())
        time.sleep(1)
    known = set(worker_nodes())

    name = f"autoscale_{int(cpu)}_{str(gpu).replace('.', '')}"
    space = write_space(tmp_path, name, num_samples=n, max_concurrent=n, cpu=cpu, gpu=gpu, fixed=FIXED)
    storage = tmp_path / "res"
    out = open(tmp_path / "driver.log", "wb")
    t_driver = time.time()
    # every trial holds after its first epoch's checkpoint until the test has seen all n trials' resources held at
    # once (search_hooks.HoldAfter), or for RELEASE_AFTER_S at most: without the hold, a loaded box could end worker
    # 1's first trials before worker 2 came up, and the peak would measure the load, not the packing. A release by
    # the time limit is recorded and named in every assertion below: it means worker 2 (or its trials) did not come
    # up in time, a different failure from a packing that holds fewer than k a worker
    release = tmp_path / "release"
    released_by: list[str] = []
    driver = subprocess.Popen(hooks_cmd("hold-after-first", release, space, "--storage", str(storage), "--address",
                                        cluster.address),
                              env=hooks_env(subprocess_env()), stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    up: dict[str, float] = {}           # worker node id -> when first seen alive
    gone: dict[str, float] = {}         # worker node id -> when first seen dead
    peak = (0.0, 0.0)                   # the most CPUs, GPUs held at once (the trials' placement groups)
    peak_alive: set[str] = set()        # the workers alive then

    def poll() -> None:
        nonlocal peak, peak_alive
        # the held resources first, then the nodes: a trial's group is placed on a node only once the node has
        # registered, so every worker the count includes is in a listing taken after it. (Listed before it, a worker
        # that came up between the two calls was counted but not seen alive: the CI run of cebdc12 failed so.)
        held = reserved()
        now = time.time()
        nodes = {node: alive for node, alive in worker_nodes().items() if node not in known}
        for node, alive in nodes.items():
            if alive:
                up.setdefault(node, now)
            elif node in up:
                gone.setdefault(node, now)
        if held > peak:
            peak, peak_alive = held, {node for node, alive in nodes.items() if alive}

    try:
        while driver.poll() is None:
            poll()
            if not release.exists() and (peak == (n * cpu, n * gpu) or time.time() - t_driver > RELEASE_AFTER_S):
                released_by.append(f"{'all held' if peak == (n * cpu, n * gpu) else 'the time limit'} at "
                                   f"{time.time() - t_driver:.1f} s, peak {peak}, workers up {sorted(up)}")
                release.write_text("go\n")
            if time.time() - t_driver > RELEASE_AFTER_S + 600:   # a watchdog against a hang, not a speed claim
                pytest.fail(f"the driver had not ended {RELEASE_AFTER_S + 600} s after it started: "
                            f"{(released_by, (tmp_path / 'driver.log').read_text()[-3000:], cluster.monitor_log())}")
            time.sleep(0.5)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        out.close()
    t_done = time.time()
    assert driver.returncode == 0, ((tmp_path / "driver.log").read_text()[-3000:], cluster.monitor_log())
    # idle workers end (with the driver's tables and report written after the last trial, often before it exits)
    while set(up) - set(gone):
        poll()
        if time.time() - t_done > 600:   # a watchdog: idle workers end; how soon is the autoscaler's timer
            pytest.fail(f"workers still up 600 s after the driver ended: {(up, gone, cluster.monitor_log())}")
        time.sleep(0.5)
    t_gone = max(gone.values())

    trials = pd.read_parquet(storage / name / "trials.parquet")
    timeline = trials.assign(node=trials["node_id"].str[-5:])[["node", "started_at", "finished_at"]]
    timeline = timeline.sort_values("started_at").to_string(index=False)
    events = cluster.events(t_driver)
    # every trial once, ok, never retried
    assert len(trials) == n and trials["trial_id"].is_unique, timeline
    assert (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
    assert (trials["failures"].fillna(0) == 0).all(), trials[["trial_id", "failures"]]
    # workers start when trials wait: none before the driver, two for 2k trials (the autoscaler bin-packs the
    # waiting trials by the node type's resources). Ray 2.60's autoscaler (v1) can launch one node too many
    # while its launcher is still starting a batch and ends it at once (see docs/cluster.md): such a node ran no
    # trial, by the trials' own records, and is not counted. (Why Ray ended a node is its log's wording: printed,
    # never asserted.)
    ended = cluster.terminations()
    extra = {node for node in up if node not in set(trials["node_id"])}
    workers = set(up) - extra
    assert len(workers) == 2, (released_by, up, ended, events, timeline)
    assert set(trials["node_id"]) <= workers, (set(trials["node_id"]), workers, timeline)   # never on the head
    # packing: Ray held all n trials' resources at once on the two workers; a worker holds at most k (its CPUs
    # and GPUs), so each held exactly k. The trials' own start and finish times (the trial's body, after its
    # worker process has started and imported torch) overlap less, and a trial may reuse the process of one
    # that ended on the other worker (reuse_actors), but never more than k run on a worker at once.
    assert peak == (n * cpu, n * gpu) and peak_alive - extra == workers, (released_by, peak, peak_alive, events,
                                                                           timeline)
    per_node = {}
    for node, rows in trials.groupby("node_id"):
        spans = list(zip(pd.to_datetime(rows["started_at"]), pd.to_datetime(rows["finished_at"])))
        per_node[node[-5:]] = (len(rows), peak_at_once(spans))
    assert all(at_once <= k for _, at_once in per_node.values()), (per_node, timeline)
    # idle workers end (the wait above), and none before its trials were done
    last = pd.to_datetime(trials["finished_at"]).max().timestamp()
    assert all(gone[node] >= last for node in workers), (gone, last, ended, events)
    print(f"\n[{name}] resources {{cpu: {cpu:g}, gpu: {gpu:g}}}: {n} trials, claim {k} per worker; head up in "
          f"{cluster.started_s:.0f} s (first test); workers alive "
          f"{', '.join(f'{t - t_driver:.1f}' for t in sorted(up[w] for w in workers))} s after the driver started "
          f"({len(extra)} spare ended at once); held at once {peak[0]:g} CPU, {peak[1]:g} GPU on "
          f"{len(peak_alive - extra)} workers; trials per worker (count, bodies at once): {per_node}; driver "
          f"{t_done - t_driver:.1f} s; workers ended {', '.join(f'{gone[w] - last:.1f}' for w in sorted(workers))} s "
          f"after the last trial finished (the driver {t_done - last:.1f} s); test {t_gone - t_test:.1f} s\n"
          f"{chr(10).join(events)}\n{timeline}", file=sys.stderr)
