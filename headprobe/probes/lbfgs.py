"""L-BFGS for the linear probe, written out for what `torch.optim.LBFGS` cannot do.

`minimize` runs torch's iteration and strong-Wolfe line search (vendored in `headprobe.probes.line_search`),
but can start from the curvature pairs of an earlier fit and scale its first inverse-Hessian guess by a
preconditioner; the linear probe uses both to walk its C grid as one regularisation path
(`headprobe.probes.logistic`).
"""

from __future__ import annotations

import torch

from headprobe.probes.line_search import strong_wolfe


def minimize(
    evaluate,
    theta: torch.Tensor,
    loss: float,
    grad: torch.Tensor,
    *,
    tol: float,
    max_iter: int,
    precondition,
    history: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    memory: int = 50,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], int, int, str]:
    """Minimise with L-BFGS from theta (loss, grad = evaluate(theta) already taken); -> theta, grad, pairs,
    evaluations, iterations, why it stopped.

    The iteration is `torch.optim.LBFGS(history_size=memory, line_search_fn="strong_wolfe",
    tolerance_change=0)`'s, with the same line search (see `_line_search` for the one exception, steps whose
    predicted decrease is below the loss's rounding) and stopping rules (max |grad| <= tol, `max_iter`
    iterations, 1.25 · max_iter evaluations, a step that cannot move), written out for what that optimizer
    cannot do: start from curvature pairs (`history`) of an earlier fit, and scale the initial inverse Hessian
    by a preconditioner instead of the identity (`precondition`: (..., P) -> (..., P) rows times P, with P
    symmetric positive definite; the initial matrix is then γP, γ = sᵀy / yᵀPy of the newest pair).

    The direction comes from the compact form of the L-BFGS inverse Hessian (Byrd, Nocedal & Schnabel 1994,
    eq. 2.6) rather than the two-loop recursion: the same matrix, but a handful of matrix products over the
    stored pairs instead of 4 · memory vector operations, each dispatched from Python (with 100 pairs these
    cost about a quarter of an evaluation: `benchmarks/results/choices.json`, `lbfgs_two_loop`). What remains is
    reading the stored pairs about seven times per iteration, so `memory` is 50 rather than torch's 100, which
    takes about as many loss evaluations over `benchmarks/bench_linear.py`'s grid (figures:
    `benchmarks/README.md`, "Measurements quoted by the modules").
    """
    size, dtype = theta.shape[0], theta.dtype
    # Pairs live in rows [first, last) of buffers twice the memory, oldest first, so every product below takes
    # contiguous slices; when the buffers fill up, the newest memory - 1 rows move to the front (one copy per
    # memory iterations) instead of the order being restored by index on every iteration.
    steps = theta.new_empty(2 * memory, size)  # s
    changes = theta.new_empty(2 * memory, size)  # y
    preconditioned = theta.new_empty(2 * memory, size)  # P y
    sy = torch.zeros(2 * memory, 2 * memory, dtype=torch.float64, device=theta.device)  # sy[i, j] = s_i · y_j
    ypy = torch.zeros_like(sy)  # y_i · P y_j
    first = last = 0

    def add_pair(s: torch.Tensor, y: torch.Tensor, py: torch.Tensor) -> None:
        nonlocal first, last
        if last == 2 * memory:
            keep = slice(last - memory + 1, last)
            for buffer in (steps, changes, preconditioned):
                buffer[: memory - 1] = buffer[keep].clone()
            for gram in (sy, ypy):
                gram[: memory - 1, : memory - 1] = gram[keep, keep].clone()
            first, last = 0, memory - 1
        steps[last], changes[last], preconditioned[last] = s, y, py
        window = slice(first, last + 1)
        sy[last, window] = (changes[window] @ s).double()
        sy[window, last] = (steps[window] @ y).double()
        ypy[last, window] = ypy[window, last] = (preconditioned[window] @ y).double()
        last += 1
        first = max(first, last - memory)

    if history:  # loaded at once: three products instead of one round of add_pair per pair
        last = len(history)
        steps[:last], changes[:last] = torch.stack([s for s, _ in history]), torch.stack([y for _, y in history])
        preconditioned[:last] = precondition(changes[:last])
        sy[:last, :last] = (steps[:last] @ changes[:last].T).double()
        ypy[:last, :last] = (changes[:last] @ preconditioned[:last].T).double()

    def direction_for(g: torch.Tensor, pg: torch.Tensor) -> torch.Tensor:
        """-H g, given pg = P g."""
        if last == first:
            return pg.neg()
        window = slice(first, last)
        S, PY, SY = steps[window], preconditioned[window], sy[window, window]
        gamma = SY[-1, -1] / ypy[last - 1, last - 1]
        a, b = (S @ g).double(), (PY @ g).double().mul_(gamma)
        R, middle = SY.triu(), ypy[window, window] * gamma + torch.diag(SY.diagonal())
        r_a = torch.linalg.solve_triangular(R, a[:, None], upper=True)
        p1 = torch.linalg.solve_triangular(R.T, middle @ r_a - b[:, None], upper=False)
        hg = (pg * gamma.to(dtype)).addmv_(S.T, p1[:, 0].to(dtype)).addmv_(PY.T, r_a[:, 0].to(dtype), alpha=-gamma)
        return hg.neg_()

    max_evaluations = max_iter * 5 // 4
    evaluations, iterations, stop = 1, 0, "tolerance"
    pg = precondition(grad[None])[0]
    while grad.abs().max() > tol:
        if iterations >= max_iter or evaluations >= max_evaluations:
            stop = "max_iter" if iterations >= max_iter else "max_evaluations"
            break
        direction = direction_for(grad, pg)
        slope = grad.dot(direction)
        if slope > 0:
            stop = "no_progress"
            break
        t = 1.0 if last > first else min(1.0, 1.0 / direction.abs().sum().item())
        new_loss, new_grad, t, used = _line_search(evaluate, theta, t, direction, loss, grad, slope,
                                                   max_evaluations - evaluations)
        evaluations += used
        iterations += 1
        step = direction.mul_(t)
        change = new_grad - grad
        new_pg = precondition(new_grad[None])[0]
        if change.dot(step) > 1e-10:
            # P is linear and fixed within a fit, so P y = P g_new - P g, and P g_new is needed next anyway.
            add_pair(step, change, new_pg - pg)
        theta, loss, grad, pg = theta + step, new_loss, new_grad, new_pg
        if step.abs().max() <= 0:
            stop = "no_progress" if grad.abs().max() > tol else "tolerance"
            break
    pairs = [(steps[i].clone(), changes[i].clone()) for i in range(first, last)]
    return theta, grad, pairs, evaluations, iterations, stop


def _line_search(
    evaluate, theta: torch.Tensor, t: float, direction: torch.Tensor, loss: float, grad: torch.Tensor,
    slope: torch.Tensor, budget: int,
) -> tuple[float, torch.Tensor, float, int]:
    """torch's strong-Wolfe line search, except where the decrease it asks for is below the loss's rounding.

    When |t · slope| is under one unit of rounding of the loss in the parameters' dtype, the sufficient-decrease
    test compares rounding noise (float32 logits resolve a loss of ~2 to ~1e-9, and near the optimum the
    predicted decrease is smaller), and the search zooms for nothing: 6-7 evaluations for one step at C = 0.01
    on the benchmark. There the first trial step is accepted on Hager & Zhang's (2005) approximate Wolfe
    conditions instead -- the loss may not rise by more than that rounding, and the slope along the line must
    have risen to within [0.9 · slope, -0.8 · slope] -- which test the gradient, still accurate there. Otherwise
    that first evaluation is handed to torch's search, so nothing is evaluated twice.
    -> (loss, grad, step length, evaluations).
    """
    first = None
    rounding = torch.finfo(theta.dtype).eps * abs(loss)
    if abs(t * float(slope)) <= rounding:
        first = evaluate(theta + t * direction)
        new_slope = float(first[1].dot(direction))
        if first[0] <= loss + rounding and 0.9 * float(slope) <= new_slope <= -0.8 * float(slope):
            return first[0], first[1], t, 1

    def along(start: torch.Tensor, step: float, d: torch.Tensor) -> tuple[float, torch.Tensor]:
        nonlocal first
        if first is not None and step == t:
            cached, first = first, None
            return cached
        return evaluate(start + step * d)

    return strong_wolfe(along, theta, t, direction, loss, grad, slope, max_ls=budget)
