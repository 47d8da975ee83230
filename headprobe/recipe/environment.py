"""The environment variables headprobe reads, checked by `headprobe validate` as a run would read them:
``HEADPROBE_THREADS`` and ``OMP_NUM_THREADS`` (thread counts, `parallel.threads`) and ``HEADPROBE_LOCK_TIMEOUT``
(seconds, `record.lock`). A run refuses the same values when it reads them; validate says so before it starts."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .fields import RecipeError


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """RecipeError with the sentence a run would give for the first variable it could not use."""
    from headprobe.parallel.threads import thread_count
    from headprobe.record.lock import stale_after_s

    environ = os.environ if environ is None else environ
    for name in ("HEADPROBE_THREADS", "OMP_NUM_THREADS"):
        if environ.get(name, "").strip():
            try:
                thread_count(environ[name].strip(), name)
            except ValueError as err:
                raise RecipeError(str(err)) from None
    stale_after_s(environ)
