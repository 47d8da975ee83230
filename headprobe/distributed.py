"""The process state shared by every step (one process, torchrun, or accelerate launch)."""

from __future__ import annotations


def process_state():
    """Accelerate's `PartialState`; on a machine without a GPU it is asked for CPU explicitly,
    because Accelerate only recognises a torchrun/gloo launch on CPU when `cpu=True`."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())
