"""The environment variables headprobe reads, checked by `headprobe validate` as a run reads them:
``HEADPROBE_THREADS`` and ``OMP_NUM_THREADS`` (thread counts, `parallel.threads`), ``HEADPROBE_LOCK_TIMEOUT``
(seconds, `record.lock`) and ``HEADPROBE_PEER_TIMEOUT`` (seconds, `parallel.liveness`), these two read here. A run
refuses the same values when it reads them; validate says so before."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .fields import RecipeError

# Seconds without a heartbeat after which another host's run-folder lock is stale, without HEADPROBE_LOCK_TIMEOUT.
DEFAULT_LOCK_TIMEOUT_S = 120.0
# Seconds a process of a multi-process run may go without a heartbeat before it is taken as frozen, without
# HEADPROBE_PEER_TIMEOUT: far above a heartbeat's period, far below the 2-hour collective timeout.
DEFAULT_PEER_TIMEOUT_S = 300.0


def lock_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """`HEADPROBE_LOCK_TIMEOUT` in seconds (> 0), else `DEFAULT_LOCK_TIMEOUT_S`; RecipeError with a sentence."""
    return _seconds("HEADPROBE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT_S, environ)


def peer_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """`HEADPROBE_PEER_TIMEOUT` in seconds (> 0), else `DEFAULT_PEER_TIMEOUT_S`; RecipeError with a sentence."""
    return _seconds("HEADPROBE_PEER_TIMEOUT", DEFAULT_PEER_TIMEOUT_S, environ)


def _seconds(name: str, default: float, environ: Mapping[str, str] | None) -> float:
    value = (os.environ if environ is None else environ).get(name, "")
    try:
        seconds = float(value) if value.strip() else default
    except ValueError:
        raise RecipeError(f"{name} = {value!r} is not a number of seconds; unset it or give e.g. "
                          f"{name}=300.") from None
    if not seconds > 0:
        raise RecipeError(f"{name} = {value!r} must be > 0 seconds (e.g. 300).")
    return seconds


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """RecipeError with the sentence a run would give for the first variable it could not use."""
    from headprobe.parallel.threads import thread_count

    environ = os.environ if environ is None else environ
    for name in ("HEADPROBE_THREADS", "OMP_NUM_THREADS"):
        if environ.get(name, "").strip():
            try:
                thread_count(environ[name].strip(), name)
            except ValueError as err:
                raise RecipeError(str(err)) from None
    lock_timeout_s(environ)
    peer_timeout_s(environ)
