"""How many CPU threads a run's torch uses, chosen from the CPUs this process may actually use.

`os.cpu_count()` counts the machine, not the job: a SLURM job or a container gets a CPU affinity mask (cpuset) and
a cgroup CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), and torch's default
of one thread per machine core then spins threads against other jobs. Where other work shares the job's CPUs,
fewer threads can be faster (`benchmarks/bench_threads.py`, `benchmarks/results/threads.json`: 1 thread beat 2 with
busy processes on a 2-core machine); that is the one-line warning's ``HEADPROBE_THREADS`` fix, never a silent change
of count.

The count, first of:

1. ``HEADPROBE_THREADS`` (the environment: the machine's owner knows the machine);
2. on ``--resume``, the count the run recorded (``results.json["environment"]["threads"]["count"]``), so a resumed
   run sums in the order its first part did; ``HEADPROBE_THREADS`` still overrides it, with a warning that the
   numbers may then differ in their last digits (`resumed_threads`);
3. the recipe's ``runtime.threads``;
4. an explicit ``OMP_NUM_THREADS``;
5. automatic: the usable CPUs (affinity ∩ cgroup quota, rounded down) shared among the node's local processes
   (``LOCAL_WORLD_SIZE``). These are facts of the job; the load of the moment is not, and a count that followed
   it gave the same seed different numbers (LiDAR 1.9e-12 and mi.label 2.8e-5 apart between 1 and 2 threads).
   Where other work keeps the CPUs busy (`busy_elsewhere`), the run says so in one warning line naming the
   ``HEADPROBE_THREADS`` fix, and computes with the same count as on a quiet machine (`load_warning`).

`prefer_passive_waiting` makes OpenMP threads sleep rather than spin between parallel regions (``OMP_WAIT_POLICY``
is read once, when torch loads its OpenMP runtime, so the CLI sets it before importing torch).

>>> usable_cpus(affinity=8, quota=2.5)
(2, 'affinity 8 CPUs, cgroup quota 2.5 CPUs')
>>> choose_threads(None, environ={}, affinity=4, quota=None).count
4
>>> choose_threads(None, environ={"LOCAL_WORLD_SIZE": "2"}, affinity=4, quota=None).count
2
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ThreadChoice", "apply_threads", "busy_elsewhere", "cgroup_cpu_quota", "choose_threads",
           "configure_threads", "load_warning", "prefer_passive_waiting", "resumed_threads", "usable_cpus"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_STAT = Path("/proc/stat")
_UNSET = object()


@dataclass(frozen=True)
class ThreadChoice:
    """count: intra-op threads; source: which setting decided it ("HEADPROBE_THREADS", "recipe runtime.threads",
    "resumed run", "OMP_NUM_THREADS" or "auto"); rule: the sentence `results.json["environment"]["threads"]` records."""

    count: int
    source: str
    rule: str

    def to_dict(self) -> dict:
        return asdict(self)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(relative: str) -> list[str]:
    """'/a/b' → ['a/b', 'a', '']: a limit set on a parent cgroup binds its children too."""
    parts = [p for p in relative.strip("/").split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    if text is None:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None  # -1: no quota
    return int(quota) / int(period)


def cgroup_cpu_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs this process's cgroup may use per period (e.g. 2.5), the tightest over its cgroup and their
    ancestors; None without a quota. cgroup v2 (``0::/path`` in /proc/self/cgroup, ``cpu.max`` "max 100000" or
    "250000 100000") and v1 (a ``cpu`` controller line, ``cpu.cfs_quota_us`` -1 or a quota over
    ``cpu.cfs_period_us``)."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    quotas: list[float] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            folders = [root / rel for rel in _ancestors(relative)]
            quotas += [q for q in map(_v2_quota, folders) if q is not None]
        elif "cpu" in controllers.split(","):
            for mount in (controllers, "cpu,cpuacct", "cpu"):
                folders = [root / mount / rel for rel in _ancestors(relative)]
                quotas += [q for q in map(_v1_quota, folders) if q is not None]
    return min(quotas) if quotas else None


def affinity_cpus() -> int:
    """The CPUs in this process's affinity mask (what a scheduler or `taskset` allows), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def usable_cpus(affinity: int | None = None, quota: float | None | object = _UNSET) -> tuple[int, str]:
    """(CPUs this process may use, how that was found): the affinity mask, capped by the cgroup quota rounded down
    (a thread past the quota is throttled, not run); at least 1."""
    affinity = affinity_cpus() if affinity is None else affinity
    quota = cgroup_cpu_quota() if quota is _UNSET else quota
    count = affinity if quota is None else min(affinity, max(1, math.floor(quota)))
    where = f"affinity {affinity} CPUs, cgroup quota " + ("none" if quota is None else f"{quota:g} CPUs")
    return max(1, count), where


def busy_elsewhere(proc_stat: Path = PROC_STAT, samples: int = 10, interval_s: float = 0.01) -> tuple[float, str]:
    """(CPUs busy with other work now, how that was measured): the median over `samples` reads of the runnable
    threads (``procs_running`` in /proc/stat), less the one reading it; the 1-minute load average where
    /proc/stat has no such line (not Linux), 0 where neither exists."""
    import statistics
    import time

    counts = []
    for i in range(samples):
        text = _read(proc_stat) or ""
        running = [line.split()[1] for line in text.splitlines() if line.startswith("procs_running ")]
        if not running:
            break
        counts.append(max(0, int(running[0]) - 1))
        if i + 1 < samples:
            time.sleep(interval_s)
    if counts:
        return float(statistics.median(counts)), f"runnable threads elsewhere now (median of {len(counts)} reads)"
    if hasattr(os, "getloadavg"):
        return os.getloadavg()[0], "the 1-minute load average"
    return 0.0, "no load measure on this system"


def thread_count(text: str, name: str) -> int:
    """The thread count the environment variable `name` sets to `text`; ValueError with a sentence otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={text!r} is not a thread count; set it to a whole number >= 1 (e.g. {name}=4), "
                         "or unset it to let headprobe choose from the CPUs it may use.")
    return value


def choose_threads(requested: int | None, environ: Mapping[str, str] | None = None, *,
                   affinity: int | None = None, quota: float | None | object = _UNSET,
                   local_processes: int | None = None, recorded: int | None = None) -> ThreadChoice:
    """The intra-op thread count (module docstring: HEADPROBE_THREADS, then `recorded` (the count a resumed run
    recorded), then `requested` (the recipe's runtime.threads), then OMP_NUM_THREADS, then automatic from the usable
    CPUs alone). The keyword arguments stand in for the machine in tests: affinity and cgroup quota
    (`usable_cpus`) and the local processes (default ``LOCAL_WORLD_SIZE``)."""
    environ = os.environ if environ is None else environ
    if environ.get("HEADPROBE_THREADS", "").strip():
        count = thread_count(environ["HEADPROBE_THREADS"].strip(), "HEADPROBE_THREADS")
        return ThreadChoice(count, "HEADPROBE_THREADS", f"HEADPROBE_THREADS={count}")
    if recorded is not None:
        return ThreadChoice(recorded, "resumed run", f"{recorded} as the resumed run recorded")
    if requested is not None:
        return ThreadChoice(requested, "recipe runtime.threads", f"runtime.threads: {requested} in the recipe")
    if environ.get("OMP_NUM_THREADS", "").strip():
        count = thread_count(environ["OMP_NUM_THREADS"].strip(), "OMP_NUM_THREADS")
        return ThreadChoice(count, "OMP_NUM_THREADS", f"OMP_NUM_THREADS={count}")
    cpus, where = usable_cpus(affinity, quota)
    if local_processes is None:
        local_processes = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    count = max(1, cpus // max(1, local_processes))
    rule = (f"auto: {cpus} usable CPUs ({where}) / {local_processes} local process"
            f"{'es' if local_processes > 1 else ''} = {count} thread{'s' if count > 1 else ''}")
    return ThreadChoice(count, "auto", rule)


def load_warning(choice: ThreadChoice, busy: float, machine_cpus: int) -> str | None:
    """The one line saying that other work (`busy` CPUs of the machine's `machine_cpus`) leaves fewer idle CPUs
    than an automatic count's threads, so the run may be slow, and the fix; None otherwise. The count itself is
    kept: numbers must not depend on the load."""
    idle = max(1, round(machine_cpus - busy))
    if choice.source != "auto" or idle >= choice.count:
        return None
    return (f"{busy:g} of this machine's {machine_cpus} CPUs are busy with other work, leaving {idle} for headprobe's "
            f"{choice.count} threads, so this run may be slow; set HEADPROBE_THREADS={idle} to use fewer (the numbers "
            "may then differ from a quiet machine's in their last digits).")


def resumed_threads(run_dir: Path, environ: Mapping[str, str] | None = None) -> int | None:
    """The thread count a run in `run_dir` recorded (``results.json["environment"]["threads"]["count"]``), for
    `--resume` to reuse; None where there is none (no run yet, or none readable).
    Warns where HEADPROBE_THREADS asks for another count."""
    import json
    import warnings

    environ = os.environ if environ is None else environ
    try:
        count = json.loads((Path(run_dir) / "results.json").read_text())["environment"]["threads"]["count"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(count, int) or count < 1:
        return None
    asked = environ.get("HEADPROBE_THREADS", "").strip()
    if asked and asked != str(count):
        warnings.warn(f"HEADPROBE_THREADS={asked} overrides the {count} threads the resumed run in {run_dir} "
                      "recorded; its numbers may differ in the last digits from a run that kept one count (unset "
                      "HEADPROBE_THREADS to resume with the recorded count).", stacklevel=2)
    return count


def apply_threads(choice: ThreadChoice) -> None:
    """Set torch's intra-op threads, and every BLAS/OpenMP pool already loaded (numpy's, scipy's, sklearn's), to
    `choice.count`. DataLoader workers use one thread each, as torch sets them."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(choice.count)
    threadpool_limits(limits=choice.count)


def configure_threads(requested: int | None, recorded: int | None = None) -> dict:
    """Choose (`choose_threads`) and apply (`apply_threads`) the run's threads; returns what
    `results.json["environment"]["threads"]` records: count, source, rule and the OpenMP wait policy.
    `recorded`: the count of the run being resumed (`resumed_threads`). An automatic count that other work would
    slow down is kept, with one warning line (`load_warning`)."""
    import warnings

    choice = choose_threads(requested, recorded=recorded)
    if choice.source == "auto":
        busy, _ = busy_elsewhere()
        line = load_warning(choice, busy, os.cpu_count() or choice.count)
        if line is not None:
            warnings.warn(line, stacklevel=2)
    apply_threads(choice)
    return choice.to_dict() | {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}


def prefer_passive_waiting(environ: dict | None = None) -> bool:
    """Ask OpenMP to let idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a policy; only
    before torch is imported (its OpenMP runtime reads the variable once, when it loads). Returns whether it was
    set."""
    import sys

    environ = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in environ or "torch" in sys.modules:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
