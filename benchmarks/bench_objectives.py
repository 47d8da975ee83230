"""headprobe's SSL objectives against lightly's losses: the same value, and the time of a forward and backward pass.

`train.objectives` (InfoNCE, VICReg, Barlow Twins, SimSiam) against `lightly.loss` (`NTXentLoss`, `VICRegLoss`,
`BarlowTwinsLoss`, `NegativeCosineSimilarity` symmetrised with stop-gradients as SimSiam's paper writes it), each
with the other's default hyper-parameters matched, on one batch of two views (B × D, float32, CPU unless a GPU is
there). lightly is a development dependency only (it brings PyTorch Lightning), so a replacement would add it to
every install; this records whether the hand-written functions cost anything for that.

    python benchmarks/bench_objectives.py [--quick]
"""

from __future__ import annotations

import torch
from _common import Report, device, interleaved, parse_args

from headprobe.train.objectives import barlow_twins, info_nce, simsiam, vicreg

# Not slower than lightly: at least this fraction of its speed (a forward and backward pass of one batch).
TARGET = 0.9
SAME = 1e-5  # largest relative difference of the loss values that counts as the same objective


def pairs(batch: int, dim: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(batch, dim, generator=g)
    views = [base + 0.5 * torch.randn(batch, dim, generator=g) for _ in range(4)]
    return [v.to(device()).requires_grad_(True) for v in views]


def lightly_losses() -> dict:
    from lightly.loss import BarlowTwinsLoss, NegativeCosineSimilarity, NTXentLoss, VICRegLoss

    ntxent, vic, bt, cos = NTXentLoss(temperature=0.1), VICRegLoss(), BarlowTwinsLoss(lambda_param=5e-3), \
        NegativeCosineSimilarity()
    return {"info_nce": lambda z1, z2, p1, p2: ntxent(z1, z2),
            "vicreg": lambda z1, z2, p1, p2: vic(z1, z2),
            "barlow_twins": lambda z1, z2, p1, p2: bt(z1, z2),
            "simsiam": lambda z1, z2, p1, p2: 0.5 * (cos(p1, z2.detach()) + cos(p2, z1.detach()))}


def headprobe_losses() -> dict:
    return {"info_nce": lambda z1, z2, p1, p2: info_nce(z1, z2, 0.1).loss,
            "vicreg": lambda z1, z2, p1, p2: vicreg(z1, z2).loss,
            "barlow_twins": lambda z1, z2, p1, p2: barlow_twins(z1, z2, 5e-3).loss,
            "simsiam": lambda z1, z2, p1, p2: simsiam(p1, p2, z1, z2).loss}


def step(loss_fn, views: list[torch.Tensor]) -> float:
    for v in views:
        v.grad = None
    loss = loss_fn(*views)
    loss.backward()
    return float(loss.detach())


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=20, quick_repeats=5)
    batch, dim = (64, 64) if args.quick else (256, 512)
    report = Report("objectives", args, {"batch": batch, "dim": dim, "dtype": "float32"})
    views = pairs(batch, dim)
    ours, theirs = headprobe_losses(), lightly_losses()
    values = {}
    for name in ours:
        times, results = interleaved({"headprobe": lambda f=ours[name]: step(f, views),
                                      "lightly": lambda f=theirs[name]: step(f, views)}, args.repeats)
        a = report.timing(f"{name}: headprobe", times["headprobe"])
        b = report.timing(f"{name}: lightly", times["lightly"])
        gap = abs(results["headprobe"] - results["lightly"]) / max(abs(results["lightly"]), 1e-12)
        values[name] = {"headprobe": results["headprobe"], "lightly": results["lightly"], "relative_difference": gap}
        report.check(f"{name} forward + backward ({batch} x {dim})", "lightly.loss", f">= {TARGET:g}x its speed",
                     f"{b / a:.2f}x ({a * 1e3:.2f} vs {b * 1e3:.2f} ms)", b / a >= TARGET, ratio=b / a)
        report.check(f"{name} value", "lightly.loss", f"relative difference <= {SAME:g}",
                     f"{results['headprobe']:.6g} vs {results['lightly']:.6g} ({gap:.1e})", gap <= SAME)
    report.extra["values"] = values
    report.note("lightly's BarlowTwinsLoss standardises with batch_norm, which adds ε = 1e-5 to the variance; "
                "headprobe's barlow_twins is the paper's formula without ε (identical views give C_ii = 1 exactly), "
                "so their values differ by design.")
    report.finish()


if __name__ == "__main__":
    main()
