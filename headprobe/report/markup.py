"""What every page of headprobe (report.html, compare.html) is rendered with: the Jinja2 templates in
``headprobe/report/templates/`` with autoescaping on, so a metric, head or recipe name is text and never markup,
and the formatting of values those templates share (`fmt`, `flatten`).

>>> environment().from_string("<td>{{ name }}</td>").render(name="<script>")
'<td>&lt;script&gt;</td>'
"""

from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup

__all__ = ["data_uri", "environment", "flatten", "fmt", "render"]


def fmt(value, plain: bool = False) -> str:
    """A value as short text: floats to 4 decimals below 10, 2 above, 3 significant digits when tiny or huge
    (up to 6 significant digits when `plain`, for settings); long lists shortened."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float) and plain:
        return f"{value:.6g}"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3g}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(fmt(v, plain) for v in value[:8])
        return f"[{items}, … ({len(value)} values)]" if len(value) > 8 else f"[{items}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt(v, plain)}" for k, v in value.items()) + "}"
    return str(value)


def flatten(data: dict, prefix: str = "") -> dict:
    """Nested dicts → one level with dotted keys; lists and scalars are kept as values."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def data_uri(path: str | Path) -> str:
    """A PNG file as a ``data:`` URI, so the page carries its figures and links nothing outside."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The templates shipped as package data; undefined names are errors, not blanks."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("headprobe.report", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters |= {"fmt": fmt, "plain": lambda value: fmt(value, plain=True), "flatten": flatten,
                    "data_uri": data_uri, "basename": lambda path: Path(path).name}
    env.tests["number"] = _is_number
    return env


def render(template: str, **context) -> Markup:
    """`template` (a path under templates/) rendered with `context`; the result is safe to place in another page."""
    return Markup(environment().get_template(template).render(**context))

