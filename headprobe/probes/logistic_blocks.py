"""What the linear probe computes over the rows of a tap, one block of rows at a time (`headprobe.probes.row_blocks`):
the objective and its gradient (`loss_and_grad`), the standardisation's moments (`standardizer`), the feature
moments that shape the preconditioner (`second_moments`, `squared_norms`), validation scores (`validation_scores`)
and test predictions (`predict`). Read as one block, each gives exactly what the whole-matrix computation gave
before; over several blocks, the same up to the order of its sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headprobe.probes.row_blocks import Rows


def _one_hot(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """y: (N,) class indices -> (K, N) float64 one-hot targets, the layout `loss_and_grad` takes."""
    return F.one_hot(y.long(), num_classes).T.to(torch.float64, memory_format=torch.contiguous_format)


@torch.no_grad()
def loss_and_grad(
    rows: Rows,
    y: torch.Tensor,
    Wt: torch.Tensor,
    b: torch.Tensor,
    C: float,
    binary: bool,
    *,
    curvature: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Mean cross-entropy + ‖W‖² / (2 C N) and its gradient; rows: N rows of dimension D (`Rows.dim`), y: (N,)
    labels, Wt: (F, D), b: (F,) -> (float64 loss, (F, D) grad of Wt, (F,) grad of b, A), with F = K, or 1 for K = 2
    (class 0 fixed at 0). With `curvature`, A is the (F, F) float64 mean softmax Hessian in the logits,
    mean_n diag(p_n) - p_n p_nᵀ (for the class preconditioner), otherwise None. The products run in Wt's
    dtype (rows in another dtype are converted as they are read); whitened rows in float64, with the whitening
    folded into the weights (`Rows.logit_weights`).

    Written out rather than left to autograd: it reads each row once per product with no saved activations, and
    takes the softmax, the loss and its sum in float64. In float32 the loss is resolved only to ~1e-7 of its
    value, so L-BFGS's line search stalls before sklearn's gradient test (max |grad| ≤ tol) is met -- at
    max |grad| ~2e-5 for C = 1e-4 on 8000 × 768 features -- and burns evaluations there; the (K, N) logits are
    small, so float64 there costs nothing measurable. Targets are one-hot: the log-likelihood and p − target are
    then two plain element-wise operations per block. Indexing by (label, row) pairs costs about the same
    (`benchmarks/results/choices.json`, `logistic_one_hot`) but sums in another order, so a switch would change the
    probe's last bits.
    """
    n = len(rows)
    folded = rows.whitening is not None
    weights, bias = rows.logit_weights(Wt, b)
    classes = Wt.shape[0] + binary
    log_likelihood = torch.zeros((), dtype=torch.float64, device=Wt.device)
    grad_w = torch.zeros_like(weights) if folded else Wt / (C * n)
    grad_b = torch.zeros_like(bias)
    A = torch.zeros(classes, classes, dtype=torch.float64, device=Wt.device)
    for start, block in rows.blocks():
        # Sub-blocks of ~4 MiB: one can still be in cache for the second product (gᵀx), so a block need not be read
        # from memory twice per evaluation (against 1 and 64 MiB sub-blocks, a small difference:
        # `benchmarks/results/choices.json`, `logistic_blocks`). On a GPU one sub-block is the block.
        step = len(block) if block.is_cuda else max(256, 2**22 // max(1, block.shape[1] * block.element_size()))
        for offset in range(0, len(block), step):
            sub = block[offset : offset + step].to(weights.dtype)  # a float64 finish of float32 rows; else a no-op
            target = _one_hot(y[start + offset : start + offset + len(sub)], classes)
            z = torch.addmm(bias[:, None], weights, sub.T)
            if binary:
                z = torch.cat([torch.zeros_like(z), z])
            log_p = z.log_softmax(dim=0, dtype=torch.float64)
            log_likelihood += (log_p * target).sum()
            p = log_p.exp_()
            if curvature:
                A += torch.diag(p.sum(dim=1)) - p @ p.T
            g = p.sub_(target)
            g = (g[1:] if binary else g).to(weights.dtype)
            grad_w.addmm_(g, sub, alpha=1 / n)
            grad_b.add_(g.sum(dim=1), alpha=1 / n)
    if folded:
        grad_w = rows.pull_back(grad_w, grad_b).to(Wt.dtype) + Wt / (C * n)
        grad_b = grad_b.to(b.dtype)
    penalty = torch.linalg.vector_norm(Wt, dtype=torch.float64) ** 2 / (2 * C * n)
    loss = penalty - log_likelihood / n
    return loss, grad_w, grad_b, ((A[1:, 1:] if binary else A) / n if curvature else None)


def standardizer(rows: Rows, enabled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean (D,), scale (D,)) such that (x − mean) / scale has zero mean and unit variance over `rows` (as read,
    before any map); zeros and ones when not `enabled`. One block: torch's `std_mean` of it; several: float64 sums
    of the rows less the first block's mean, rounded to the rows' dtype."""
    dtype, device = rows.dtype, rows.device
    if not enabled:
        return torch.zeros(rows.dim, dtype=dtype, device=device), torch.ones(rows.dim, dtype=dtype, device=device)
    if len(rows) <= rows.block_rows:
        std, mean = torch.std_mean(rows.read(0, len(rows)), dim=0, correction=0)
    else:
        shift = total = squares = None
        for _, block in rows.blocks():
            block = block.to(torch.float64)
            if shift is None:
                shift = block.mean(dim=0)
                total, squares = torch.zeros_like(shift), torch.zeros_like(shift)
            block -= shift
            total += block.sum(dim=0)
            squares += (block * block).sum(dim=0)
        centre = total / len(rows)
        mean = (shift + centre).to(dtype)
        std = (squares / len(rows) - centre**2).clamp_min(0).sqrt().to(dtype)
    # A constant feature's computed std is rounding noise of order eps·|mean|; dividing by it would blow
    # that noise up to unit variance, so such features are only centred (much like sklearn's StandardScaler).
    constant = std <= 10 * torch.finfo(dtype).eps * mean.abs().clamp_min(1e-30)
    return mean, torch.where(constant, torch.ones_like(std), std)


def second_moments(rows: Rows) -> torch.Tensor:
    """float64 xᵀx / N over `rows` in the probe's coordinates: (D, D)."""
    out = None
    for _, block in rows.features():
        block = block.double()
        out = block.T @ block if out is None else out.addmm_(block.T, block)
    return out / len(rows)


def squared_norms(rows: Rows) -> torch.Tensor:
    """Σ_n x_n² per coordinate over `rows` in the probe's coordinates, in the rows' dtype: (D,)."""
    out = None
    for _, block in rows.features():
        block = torch.linalg.vector_norm(block, dim=0) ** 2
        out = block if out is None else out + block
    return out.to(rows.dtype)


def _logit_weights(rows: Rows, W: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (D, K), b (K,)) of the probe -> the weights and intercepts that multiply `rows.blocks()`."""
    weights, bias = rows.logit_weights(W.T, b)
    return weights.T, bias


def validation_scores(rows: Rows, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    """(correct predictions, mean cross-entropy in nats (float64 softmax)) of the probe (W, b) on `rows`, y: (M,)."""
    weights, bias = _logit_weights(rows, W, b)
    correct, log_loss = 0, torch.zeros((), dtype=torch.float64, device=W.device)
    for start, block in rows.blocks():
        labels = y[start : start + len(block)]
        logits = block.to(weights.dtype) @ weights + bias
        correct += int((logits.argmax(dim=1) == labels).sum())
        log_loss += F.cross_entropy(logits.double(), labels, reduction="sum")
    return correct, (log_loss / len(rows)).item()


def predict(rows: Rows, W: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted classes (M,) int64, class probabilities (M, K) float32) of the probe (W, b), on the CPU."""
    weights, bias = _logit_weights(rows, W, b)
    predictions, probabilities = [], []
    for _, block in rows.blocks():
        logits = block.to(weights.dtype) @ weights + bias
        probabilities.append(torch.softmax(logits, dim=1).float().cpu())
        predictions.append(logits.argmax(dim=1).cpu())
    return torch.cat(predictions), torch.cat(probabilities)
