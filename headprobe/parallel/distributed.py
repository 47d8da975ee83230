"""The process state shared by every step (one process, torchrun, or accelerate launch)."""

from __future__ import annotations

import atexit
import math
import os
import warnings
from datetime import timedelta

_CLEANUP_REGISTERED = False
COLLECTIVE_TIMEOUT_S = 7200.0


def process_state():
    """Accelerate's `PartialState`; on a machine without a GPU it is asked for CPU explicitly,
    because Accelerate only recognises a torchrun/gloo launch on CPU when `cpu=True`.

    When this call is what starts the process group (torchrun / accelerate launch, and the caller has not started
    one), it is destroyed again when the interpreter exits (`destroy_at_exit`). A group the caller started is the
    caller's to destroy."""
    import torch
    import torch.distributed as dist
    from accelerate import PartialState

    started_before = dist.is_available() and dist.is_initialized()
    state = PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=collective_timeout_s()))
    if not started_before and dist.is_available() and dist.is_initialized():
        _register_cleanup()
    return state


def collective_timeout_s() -> float:
    """How long a process waits in one collective for the others before the run fails, in seconds:
    `HEADPROBE_COLLECTIVE_TIMEOUT`, else `COLLECTIVE_TIMEOUT_S` (2 h: one process may work alone that long at GPU scale,
    on its share of a large k-NN bank or the longest probe, while the others wait at the next exchange). Applies to
    the process group headprobe starts; an unusable value warns and the default applies."""
    value = os.environ.get("HEADPROBE_COLLECTIVE_TIMEOUT", "").strip()
    try:
        seconds = float(value) if value else COLLECTIVE_TIMEOUT_S
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        warnings.warn(f"HEADPROBE_COLLECTIVE_TIMEOUT = {value!r} is not a positive number of seconds; using "
                      f"{COLLECTIVE_TIMEOUT_S:.0f}.", stacklevel=2)
        return COLLECTIVE_TIMEOUT_S
    return seconds


def _register_cleanup() -> None:
    global _CLEANUP_REGISTERED
    if not _CLEANUP_REGISTERED:
        atexit.register(destroy_at_exit)
        _CLEANUP_REGISTERED = True


def destroy_at_exit() -> None:
    """Destroy a gloo default process group while the interpreter is still whole. Why: one left to the
    interpreter's finalisation can abort the process after a complete run ("terminate called without an active
    exception", exit code -6: its worker threads outlive Python; pytorch/pytorch#179291). Destroying a gloo group
    releases local resources only, so a process exiting alone after a failure waits for nobody. An NCCL group is
    left to torch (a warning at exit): its abort can wait on the other processes when one of them failed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()
