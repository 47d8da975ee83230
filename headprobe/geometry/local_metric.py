"""Claim 2's measure: how far a head's local metric at z is from the one the loss asks for, and how much of that
the head owes to adapting its metric to z.

"Nonlinear heads adapt a local metric; a constant W cannot be isotropic everywhere when the loss metric is curved.
Depth/width limit how well an MLP approximates the ideal metric" (the paper, claim 2). For one sample x_i of an
evaluation batch (a row of the stacked views [z1; z2], each view through the head on its own as in training):

- the **loss metric** at the head's output, A_i = ∂²L/∂h_i² (out × out: the diagonal block of the whole batch's
  loss Hessian, its couplings included; r_i = rank A_i);
- the head's **local metric** at z_i, the loss metric pulled back through the head's Jacobian J_i = J_h(z_i):
  G_i = J_iᵀ A_i J_i (D × D; the G-term of claim 3's effective Hessian);
- the metric **the loss asks for** is claim 1's: isotropic on the r_i directions the loss sees, |G_i| = c_i·P_i
  (P_i the projector on G_i's top-r_i eigenspace, c_i > 0 free per sample: only the shape counts, not the scale,
  which the learning rate absorbs), r_i capped at min(out, D). A map with J_i = |Λ_i|^{-1/2}U_iᵀ at z_i
  (A_i = U_iΛ_iU_iᵀ) reaches it; a linear head can do so at one z only unless A_i is the same at every z up to
  scale, a nonlinear head can at every z;
- the **distance** d_i(J) = ‖|λ| − c‖ / ‖λ‖ over the eigenvalues λ of Jᵀ A_i J (c the mean |λ| of the top r_i,
  the eigenvalues outside them counted whole: `effective.isotropy` on the magnitudes). 0 exactly when the local
  metric is the one the loss asks for. With A_i ⪰ 0 it is Q-whiten's isotropy error of the G-term; on magnitudes
  it stays defined for losses whose ∇²_h L is indefinite (InfoNCE, SimSiam), whose "isotropic" is |λ| equal;
- the **adaptation** a_i = d_i(J_j) − d_i(J_i), J_j the same head's Jacobian at another sampled image z_j of the
  batch (a cyclic shift over the sampled rows): how much closer the head's metric at z_i comes to what the loss
  asks for at z_i than the head's metric taken from elsewhere. A head with one Jacobian everywhere (linear or
  affine: J_j = J_i) has a_i = 0 exactly, so a linear head is the null by construction; a head whose Jacobian
  varies without following A (noise) has a_i = 0 in expectation (d_i(J_i) and d_i(J_j) are exchangeable); only a
  head that shapes J_i to A_i has a_i > 0. `loss_metric_change` = ‖Â_i − Â_j‖_F (Â = A/‖A‖_F) says how curved
  the loss metric is between the two samples: with a flat loss metric there is nothing to adapt to.

Computation: A_i from `out` products of the batch loss (`whiten.DiagonalBlock`: the batch's Hessian is never
formed), J_i by reverse mode (`pullback.head_jacobian`, BatchNorm on running statistics: the per-sample head), and
the spectrum of Jᵀ A J exactly in the smaller of its two sides: D × D when D ≤ out, else the out × out S A S with
S = (J Jᵀ)^{1/2}, whose eigenvalues are Jᵀ A J's nonzero ones (eig(XY) = eig(YX) away from 0). Every eigenvalue is
needed (r_i is min(out, D) or near it for the registered losses), so an iterative top-r solver would cost as much.
Memory per row: out × D (J) and out² (A) numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.effective import isotropy
from headprobe.geometry.pullback import head_jacobian
from headprobe.geometry.whiten import RANK_RTOL, DiagonalBlock, stacked_views


def metric_spectrum(jac: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The eigenvalues of the local metric Jᵀ A J, jac: (out, D), a: (out, out) symmetric; (min(out, D),), those
    left out (when D > out) are exactly 0."""
    out_dim, dim = jac.shape
    a = (a + a.T) / 2
    if dim <= out_dim:
        g = jac.T @ a @ jac
        return torch.linalg.eigvalsh((g + g.T) / 2)
    k_values, k_vectors = torch.linalg.eigh(jac @ jac.T)
    root = (k_vectors * k_values.clamp(min=0).sqrt()) @ k_vectors.T  # S = (J Jᵀ)^{1/2}
    m = root @ a @ root
    return torch.linalg.eigvalsh((m + m.T) / 2)


def metric_distance(jac: torch.Tensor, a: torch.Tensor, r: int) -> float:
    """d(J) = the distance of Jᵀ A J's eigenvalue magnitudes from c·P on their top-r (r ≤ min(out, D)), 0 when the
    local metric is the one the loss asks for; NaN when the metric is zero."""
    values = metric_spectrum(jac, a).abs()
    if float(values.max()) == 0.0:
        return float("nan")
    return isotropy(values, r, RANK_RTOL)["isotropy_error"]


def loss_metric_rank(a: torch.Tensor) -> int:
    """rank A: eigenvalues above RANK_RTOL·max|λ| (as Q-whiten counts r_i)."""
    values = torch.linalg.eigvalsh((a + a.T) / 2)
    largest = float(values.abs().max())
    return int((values.abs() > RANK_RTOL * largest).sum()) if largest > 0 else 0


def _normalised(a: torch.Tensor) -> torch.Tensor:
    norm = a.norm()
    return a / norm if norm > 0 else a


def batch_local_metric(head: nn.Module, loss_of_h: Callable[[torch.Tensor], object], z1: torch.Tensor,
                       z2: torch.Tensor, rows: torch.Tensor) -> dict:
    """One evaluation batch: at each of `rows` (indices into the stacked [z1; z2], at least 2, of different images)
    the distance d_i(J_i), the distance with the next sampled row's Jacobian d_i(J_j) and the adaptation
    a_i = d_i(J_j) − d_i(J_i) (`rows` taken cyclically). loss_of_h maps the stacked outputs (2n, out) to a scalar;
    put the head's BatchNorm on running statistics (eval mode). Rows where A_i = 0 are left out.

    Returns {"distance", "distance_swapped", "adaptation", "loss_metric_change": means over the rows kept,
    "n_rows", "rank": each kept row's r_i, "negative_share": the share of G_i's top-r_i eigenvalues below 0
    (the loss metric's indefiniteness as the head sees it), "rows": per-row records}."""
    if len(rows) < 2:
        raise ValueError(f"the adaptation compares a row's Jacobian with another row's; pass at least 2 rows, got "
                         f"{len(rows)}.")
    z = torch.cat([z1, z2]).detach()
    with torch.no_grad():
        h = stacked_views(head, len(z1))(z)
    idx = [int(i) for i in rows]
    blocks = [DiagonalBlock(loss_of_h, h, i).dense() for i in idx]
    jacs = head_jacobian(head, z[idx]).to(z.dtype)
    dim_cap = min(jacs.shape[1], jacs.shape[2])
    per_row = []
    for k, a in enumerate(blocks):
        rank = min(loss_metric_rank(a), dim_cap)
        if rank == 0:
            continue
        other = (k + 1) % len(idx)
        own, swapped = metric_distance(jacs[k], a, rank), metric_distance(jacs[other], a, rank)
        top = metric_spectrum(jacs[k], a)
        top = top[top.abs().argsort(descending=True)][:rank]
        per_row.append({"row": idx[k], "rank": rank, "distance": own, "distance_swapped": swapped,
                        "adaptation": swapped - own, "negative_share": float((top < 0).double().mean()),
                        "loss_metric_change": float((_normalised(a) - _normalised(blocks[other])).norm())})
    keys = ("distance", "distance_swapped", "adaptation", "loss_metric_change", "negative_share")
    means = {k: (sum(r[k] for r in per_row) / len(per_row) if per_row else None) for k in keys}
    return means | {"n_rows": len(per_row), "rank": [r["rank"] for r in per_row], "rows": per_row}
