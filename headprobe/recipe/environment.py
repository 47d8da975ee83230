"""The environment variables headprobe reads, checked by `headprobe validate` as a run reads them:
``HEADPROBE_THREADS`` and ``OMP_NUM_THREADS`` (thread counts, `parallel.threads`) and ``HEADPROBE_LOCK_TIMEOUT``
(seconds, `record.lock`; read here). A run refuses the same values when it reads them; validate says so before."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .fields import RecipeError

# Seconds without a heartbeat after which another host's run-folder lock is stale, without HEADPROBE_LOCK_TIMEOUT.
DEFAULT_LOCK_TIMEOUT_S = 120.0


def lock_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """`HEADPROBE_LOCK_TIMEOUT` in seconds (> 0), else `DEFAULT_LOCK_TIMEOUT_S`; RecipeError with a sentence."""
    value = (os.environ if environ is None else environ).get("HEADPROBE_LOCK_TIMEOUT", "")
    try:
        seconds = float(value) if value.strip() else DEFAULT_LOCK_TIMEOUT_S
    except ValueError:
        raise RecipeError(f"HEADPROBE_LOCK_TIMEOUT = {value!r} is not a number of seconds; unset it or give e.g. "
                          "HEADPROBE_LOCK_TIMEOUT=300.") from None
    if not seconds > 0:
        raise RecipeError(f"HEADPROBE_LOCK_TIMEOUT = {value!r} must be > 0 seconds (e.g. 300).")
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
