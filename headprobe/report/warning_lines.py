"""Warnings on the terminal as one clean line each: ``warning: MESSAGE``, once per message.

Python's own form is ``FILE:LINE: UserWarning: MESSAGE`` followed by the source line that warned, and a message
raised from two places (or two stages) shows twice. `one_line_warnings` replaces only how a warning is written
(`warnings.formatwarning`): which warnings show is still the filters' choice, and code that records warnings
(`warnings.catch_warnings(record=True)`, pytest's) still gets every one.

>>> format_line = warning_formatter()
>>> format_line("lock taken over\\n  from a dead run", UserWarning, "x.py", 3)
'warning: lock taken over from a dead run\\n'
>>> format_line("lock taken over from a dead run", UserWarning, "y.py", 9)
''
"""

from __future__ import annotations

import warnings


def warning_formatter():
    """A `warnings.formatwarning`: ``warning: MESSAGE`` on one line, "" for a message it has formatted before."""
    seen: set[str] = set()

    def format_line(message, category, filename, lineno, line=None) -> str:
        text = " ".join(str(message).split())
        if text in seen:
            return ""
        seen.add(text)
        return f"warning: {text}\n"

    return format_line


def one_line_warnings() -> None:
    """Write every warning from here on as ``warning: MESSAGE`` on one line, a message already written not again
    (in this process: a second call keeps the first's memory)."""
    if getattr(warnings.formatwarning, "__module__", None) != __name__:
        warnings.formatwarning = warning_formatter()
