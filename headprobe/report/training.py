"""The report's Training section: each head with the fields that apply to its type, how far training got, and
whether its loss curve says it trained (`convergence.training_convergence`).

A run killed while training leaves `"status": "running"` and possibly no `heads` in results.json, but its
metrics.jsonl holds every logged step: the section then says "stopped while running (last step N)" and lists the
heads from those records instead of claiming that no head was trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from markupsafe import Markup

from .convergence import RULE, training_convergence
from .markup import fmt, render

__all__ = ["CONVERGENCE_LEGEND", "head_fields", "last_step", "stopped_note", "training_section"]

# The config fields that mean something for each head type (`ProjectionHead`: a linear head is bias-free linear
# layers with no BN and no activation; an identity head has no layers; a pretrained head comes from a checkpoint).
FIELDS = {
    "mlp": ("depth", "width", "out_dim", "act", "bn_hidden", "bn_out", "l2_out", "init_scale", "predictor"),
    "linear": ("depth", "width", "out_dim", "l2_out", "init_scale", "predictor"),
    "identity": ("predictor",),
    "pretrained": ("taps",),
}
CONVERGENCE_LEGEND = f"Trained? Read from each head's logged loss: {RULE}."


def head_fields(config: Mapping, checkpoint: Mapping | None = None) -> dict:
    """The recorded config of a head reduced to what applies to its type: a linear head has no `act` or BN, a
    1-layer head no hidden `width` (its output is `out_dim`, or `width` when that is unset), a pretrained head shows
    its checkpoint record; unknown types keep every field."""
    kind = config.get("type", "mlp")
    keys = FIELDS.get(kind)
    shown = {"type": kind} | {k: v for k, v in config.items() if k not in ("name", "type")
                              and (keys is None or k in keys) and v is not None}
    if kind in ("mlp", "linear") and config.get("depth") == 1:
        shown.pop("width", None)
        shown["out_dim"] = config.get("out_dim") or config.get("width")
        for key in ("act", "bn_hidden"):
            shown.pop(key, None)
    if kind == "pretrained" and checkpoint:
        shown |= {f"checkpoint.{k}": v for k, v in checkpoint.items()}
    return shown


def last_step(history: Mapping[str, Sequence[dict]]) -> int | None:
    """The largest step any head logged, or None."""
    steps = [r["step"] for recs in history.values() for r in recs if isinstance(r.get("step"), int)]
    return max(steps) if steps else None


def stopped_note(results: dict, history: Mapping[str, Sequence[dict]]) -> str:
    """'' for a finished run; for a run still marked "running" (killed, or still going): what exists."""
    if results.get("status") != "running":
        return ""
    step = last_step(history)
    where = f" (last step {step})" if step is not None else " (no training step logged)"
    return (f"stopped while running{where}: this run did not finish (killed, or still going); the report shows "
            "what it recorded")


def _convergence_text(verdict: dict) -> str:
    if verdict["status"] == "unknown":
        return f"unknown ({verdict['n_points']} logged steps)"
    return (f"{verdict['status']}: loss {fmt(verdict['start'])} → {fmt(verdict['end'])} "
            f"({100 * verdict['relative_decrease']:.0f}% lower; tail drop {fmt(verdict['tail_drop'])} "
            f"± {fmt(verdict['tail_drop_se'])})")


def training_section(results: dict, plots: Sequence, history: Mapping[str, Sequence[dict]]) -> Markup:
    heads = results.get("heads", {})
    note = stopped_note(results, history)
    rows = []
    for name in list(heads) + [h for h in history if h not in heads]:
        head = heads.get(name, {})
        config, train = head.get("config", {}), head.get("train", {})
        recs = history.get(name, [])
        fields = ", ".join(f"{k}: {fmt(v, plain=True)}" for k, v in head_fields(config, head.get("checkpoint")).items())
        rows.append({"name": name, "fields": fields or "—",
                     "status": train.get("status") or ("stopped while running" if note else "—"),
                     "steps": train.get("steps") if head else (recs[-1]["step"] if recs else None),
                     "final": train.get("final_loss", recs[-1].get("loss") if recs else None),
                     "trained": _convergence_text(training_convergence(recs)) if recs else "—",
                     "message": train.get("message") or ""})
    return render("sections/training.html.j2", note=note, rows=rows, legend=CONVERGENCE_LEGEND,
                  protocol=results.get("protocol", {}).get("train", {}), plots=plots)
