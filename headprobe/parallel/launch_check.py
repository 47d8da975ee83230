"""Did the launcher start the processes it was asked for? A one-line warning when it asked for several and this
process sees one.

`accelerate launch --num_processes 2 --cpu` is the case that prompted it: with `--cpu`, Accelerate hands the job
to its *simple* launcher (`accelerate.commands.launch.simple_launcher`), which starts one Python process unless
MPI is set up (`--mpirun_hostfile`); because more than one process was asked for it still sets ``MASTER_ADDR`` and
``MASTER_PORT`` (`accelerate.utils.launch.prepare_simple_launcher_cmd_env`), but no ``RANK`` or ``WORLD_SIZE``.
torchrun and Accelerate's multi-process launcher (`--multi_gpu`, which runs torchrun's elastic agent, also on a
CPU-only machine with gloo) set ``WORLD_SIZE`` in every process they start, and MPI sets its own size variable;
a size there that is larger than the world the process joined means the processes did not meet.

>>> launch_warning({"WORLD_SIZE": "2"}, world=1).startswith("warning: the launcher asked for 2 processes")
True
>>> launch_warning({"WORLD_SIZE": "2", "RANK": "0"}, world=2) is None
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["launch_warning", "requested_processes", "warn_if_fewer_processes"]

# Where a launcher writes how many processes it started (torchrun/Accelerate, Open MPI, Intel MPI/MPICH, MVAPICH);
# accelerate's PartialState reads the same names to decide whether it is distributed.
SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
WORKING_COMMANDS = ("`accelerate launch --multi_gpu --num_processes N -m headprobe run RECIPE` or "
                    "`torchrun --nproc_per_node N -m headprobe run RECIPE`")


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(str(text).strip())
    except ValueError:
        return None
    return value if value > 0 else None


def requested_processes(env: Mapping[str, str]) -> tuple[int | None, str] | None:
    """(number of processes, where it was read) that the launcher asked for, when it asked for more than one; the
    number is None where the launcher did not write it down (Accelerate's simple launcher). None when it asked for
    one process, or nothing launched this one."""
    for name in SIZE_VARIABLES:
        size = _positive_int(env.get(name))
        if size is not None and size > 1:
            return size, f"{name}={size}"
    # Accelerate's simple launcher: ACCELERATE_* variables, a rendezvous address that it sets only for more than
    # one process, and no rank (no launcher that starts several processes leaves RANK unset).
    accelerate = any(name.startswith("ACCELERATE_") for name in env)
    if accelerate and "MASTER_ADDR" in env and "MASTER_PORT" in env and "RANK" not in env:
        return None, "accelerate launch set MASTER_ADDR and MASTER_PORT but started no other rank"
    return None


def launch_warning(env: Mapping[str, str], world: int) -> str | None:
    """One line saying that the launcher asked for more processes than the `world` this process joined (with the
    command that works), or None when they agree."""
    asked = requested_processes(env)
    if asked is None:
        return None
    count, source = asked
    if world >= (count or 2):  # an unrecorded count is "more than one"
        return None
    wanted = f"{count} processes" if count is not None else "several processes"
    cpu = (" (`accelerate launch --cpu` runs a single process unless MPI is set up)"
           if str(env.get("ACCELERATE_USE_CPU", "")).lower() == "true" else "")
    return (f"warning: the launcher asked for {wanted} ({source}) but headprobe runs in {world}{cpu}; the run goes "
            f"on with {world}. For N processes use {WORKING_COMMANDS}.")


def warn_if_fewer_processes(world: int, env: Mapping[str, str] | None = None, show: bool = True) -> str | None:
    """Print `launch_warning` to stderr (when `show`: the main process) and return it."""
    import sys

    message = launch_warning(os.environ if env is None else env, world)
    if message is not None and show:
        print(message, file=sys.stderr)
    return message
