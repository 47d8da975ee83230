"""A pretend accelerator for checking, on a machine without a GPU, that code keeps its tensors on one device.

`fake_accelerator()` makes `ACCELERATOR` (torch's `meta` device) behave like a GPU whose memory is the CPU's:
`x.to(ACCELERATOR)` gives a tensor that reports that device and holds its values in CPU memory, and every op on
such tensors computes the same numbers the CPU would. It enforces CUDA's rules, so code that would fail on a GPU
fails here, with `DeviceMixError` naming the op:
- an op may not take a CPU tensor (other than a 0-dim scalar) together with accelerator tensors — except as the
  indices of an indexing op, and in `copy_` (a transfer), which CUDA allows too;
- a random factory (`randperm`, `randn`, ...) on the accelerator may not be given a CPU `torch.Generator`;
- `.numpy()` / `np.asarray` of an accelerator tensor raise `TypeError`, as for a CUDA tensor (scikit-learn needs
  a `.cpu()` copy); `.item()`, `float()`, `.tolist()` and `.cpu()` work, as on CUDA.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

ACCELERATOR = torch.device("meta")
_CPU = torch.device("cpu")
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
             torch.ops.aten._index_put_impl_.default}
_TRANSFERS = {torch.ops.aten.copy_.default, torch.ops.aten.copy.default}
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}


class DeviceMixError(RuntimeError):
    """An op combined CPU and accelerator tensors where CUDA would refuse to."""


class OnAccelerator(torch.Tensor):
    """A tensor on `ACCELERATOR` whose values live in `self.inner`, a CPU tensor of the same shape."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            device=ACCELERATOR, requires_grad=inner.requires_grad)
        wrapper.inner = inner
        return wrapper

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert an accelerator tensor to numpy: use Tensor.cpu() to copy it to the host first")

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert an accelerator tensor to numpy: use Tensor.cpu() to copy it to the host first")

    def __repr__(self) -> str:
        return f"OnAccelerator({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("OnAccelerator tensors work only inside `with fake_accelerator():`.")


def _on_accelerator(device) -> bool:
    return device is not None and torch.device(device).type == ACCELERATOR.type


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        leaves, _ = tree_flatten((args, kwargs))
        from_accelerator = any(isinstance(a, OnAccelerator) for a in leaves)
        device = kwargs.get("device")
        to_accelerator = _on_accelerator(device)
        if to_accelerator:
            kwargs["device"] = _CPU
            generator = kwargs.get("generator")
            if generator is not None and generator.device.type != ACCELERATOR.type:
                raise DeviceMixError(f"{func} makes a tensor on the accelerator from a CPU torch.Generator "
                                     "(CUDA refuses this): draw on the CPU and move the result, or use a generator "
                                     "on the device.")
        for a in leaves:
            if isinstance(a, torch.Tensor) and not isinstance(a, OnAccelerator) and a.device == ACCELERATOR:
                raise RuntimeError(f"{func} got a tensor made on the pretend accelerator below the dispatcher, whose "
                                   "values fake_accelerator cannot see; teach _FromData about the call that made it.")
        if from_accelerator and func not in _TRANSFERS:
            allowed = tree_flatten(args[1])[0] if func in _INDEXING else []
            for a in leaves:
                if (isinstance(a, torch.Tensor) and not isinstance(a, OnAccelerator) and a.dim() > 0
                        and not any(a is b for b in allowed)):
                    raise DeviceMixError(f"{func} takes a CPU tensor of shape {tuple(a.shape)} together with "
                                         "accelerator tensors (CUDA refuses this): create it on the inputs' device.")
        wrappers = {}

        def unwrap(a):
            if isinstance(a, OnAccelerator):
                wrappers[id(a.inner)] = a
                return a.inner
            return a

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        leave_on_cpu = (device is not None and not to_accelerator) or (
            func in _TRANSFERS and not isinstance(args[0], OnAccelerator))
        if leave_on_cpu or not (to_accelerator or from_accelerator):
            return out

        def wrap(t):
            if not isinstance(t, torch.Tensor):
                return t
            return wrappers[id(t)] if id(t) in wrappers else OnAccelerator(t)

        return tree_map(wrap, out)


def _host_index(index):
    """An index with its lists (and lists inside tuples) as CPU int64 tensors, which CUDA accepts as indices."""
    if isinstance(index, tuple):
        return tuple(_host_index(i) for i in index)
    if isinstance(index, list) and all(isinstance(i, (int, bool)) for i in index):
        return torch.tensor(index, dtype=torch.bool if index and isinstance(index[0], bool) else torch.int64)
    return index


class _FromData(TorchFunctionMode):
    """Calls that build tensors from Python data below the dispatcher, where `_Dispatch` cannot see them:
    `torch.tensor(data, device=...)` is built on the CPU and moved; a list index (`x[:, [0, 2]]`), which torch
    would turn into a tensor on x's device, becomes a CPU index tensor first."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FROM_DATA and _on_accelerator(kwargs.get("device")):
            kwargs.pop("device")
            return func(*args, **kwargs).to(ACCELERATOR)
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], OnAccelerator):
            args = (args[0], _host_index(args[1]), *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_accelerator():
    """Inside: `x.to(ACCELERATOR)` and every op on the result behave like a GPU with CUDA's device rules."""
    with _FromData(), _Dispatch():
        yield


def on_host(value):
    """Every OnAccelerator tensor inside `value` (nested lists, tuples, dicts) replaced by its CPU values."""
    return tree_map(lambda t: t.inner if isinstance(t, OnAccelerator) else t, value)
