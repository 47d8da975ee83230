"""The process state shared by every step (one process, torchrun, or accelerate launch)."""

from __future__ import annotations

import atexit

_CLEANUP_REGISTERED = False


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
    state = PartialState(cpu=not torch.cuda.is_available())
    if not started_before and dist.is_available() and dist.is_initialized():
        _register_cleanup()
    return state


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
