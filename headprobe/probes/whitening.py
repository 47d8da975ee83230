"""Whitening with the full train covariance on the support of the train features: the change of coordinates that
makes the linear probe's answer independent of any invertible (or injective) linear map of the features.

`whiten(train, *others)` centres every split on the train mean and maps it to z = (x − μ) V Λ^{-1/2}, with
Σ = V Λ Vᵀ the train covariance (1/N, like `StandardScaler`) restricted to its support: the eigenvalues whose
singular values σ = √(N λ) of the centred train matrix lie above a tolerance. The train rows then have identity
covariance in r = rank dimensions. For features x' = x A with A injective on the span of the centred train rows,
the whitened rows are z' = z Q with Q an r × r orthogonal matrix (two whitenings of one covariance differ by a
rotation); an L2 logistic regression with an unpenalised intercept on z' has the optimum W' = Qᵀ W, the same
logits, the same predictions. Test (and validation) rows are mapped by the train's μ and V: their component
outside the span of the centred train rows is dropped, so the invariance holds for every row inside that span
(every row when the features lie in a subspace the train rows span, e.g. any injective map of 384-d features
into 2,048-d), and for every row under orthogonal maps.

Computed in float64, in whichever of two ways is cheaper:
- D ≤ N: the eigendecomposition of the D × D scatter matrix XcᵀXc (Xc the centred train matrix);
- D > N: the eigendecomposition of the N × N Gram matrix Xc Xcᵀ = U S² Uᵀ, with V = Xcᵀ U S⁻¹, so
  z = (x − μ) Xcᵀ (U S⁻² √N) is formed without a D × r matrix; the train rows are G U S⁻² √N (G the Gram
  matrix), so a 65,536-d output with a few thousand images costs two float64 products of the N × D matrix.
Both read the columns of x in blocks converted to float64 as they are read: no float64 copy of x is made.

The support: σ > max(σ_max · max(N, D) · eps, σ_max · √(max(N, D) · eps64)), with eps that of the input's dtype
(float32 features: float32's eps). The first term is NumPy's `matrix_rank` rule; the second is what an
eigendecomposition of a float64 product of Xc with itself resolves (its eigenvalues carry errors of order
max(N, D) · eps64 · σ_max²) and only matters for float64 inputs, whose `matrix_rank` rule would keep rounding
noise. Everything below both is rounding of the features, not a direction they vary in.

Fewer images than dimensions: the rank is at most N − 1. At rank N − 1 (N images in general position in D ≥ N − 1
dimensions) the whitened train rows satisfy Z Zᵀ = N I − 11ᵀ: they are equidistant, so no probe that a linear map
of the features cannot change can learn anything from the train rows' geometry, only from where a test row lies
relative to them (its inner products with the whitened train rows). A validation row taken from the whitened
train rows is equidistant to every fitting row too, so every validation row has the same logits and validation
accuracy cannot inform the choice of C: which C wins is decided by rounding, and is not reproducible under a map
of the features. Test accuracy then barely depends on C (2,048 random ReLU features of the pixels of the 1,347
training digits, rank 1,346: 0.962 to 0.971 over C = 1e-4 … 100, against 0.989 for the standardised probe).
Below that rank the validation rows carry information again, but the closer the rank is to N, the more the
whitening amplifies directions whose variance is estimated from few degrees of freedom (1,024 such features,
rank 989: 0.960 to 0.973 over the grid). `record` says the rank, N and D, so a reader can tell.

>>> x = torch.randn(50, 3, dtype=torch.float64) @ torch.tensor([[2.0, 1, 0], [0, 1, 0], [0, 0, 0]]).double()
>>> (z,), record = whiten(x)
>>> record["rank"], torch.allclose(z.T @ z / 50, torch.eye(2, dtype=torch.float64))
(2, True)
"""

from __future__ import annotations

import torch

from headprobe.probes.row_blocks import Rows, Whitening

# Columns of x are read in blocks of about this many float64 entries (32 MiB), converted as they are read.
_BLOCK_ENTRIES = 2**22


def whiten(train: torch.Tensor, *others: torch.Tensor | None,
           dtype: torch.dtype = torch.float64) -> tuple[list[torch.Tensor | None], dict]:
    """train: (N, D), others: (M_i, D) or None -> ([z_train (N, r), z_i (M_i, r) or None ...], record), on train's
    device, with r the rank of the centred train rows (see the module docstring). Computed in float64 and stored
    in `dtype` block by block (float32: the same values as float64 rounded afterwards, without a float64 copy of
    the tap: 6 GiB at 1M x 768). record: {"rank",
    "tolerance" (on the singular values of the centred train matrix), "sigma_max", "rule", "n", "dim",
    "method" ("covariance" or "gram")}."""
    n, d = train.shape
    if n < 2:
        raise ValueError(f"whitening needs at least 2 training rows to estimate a covariance but got {n}.")
    mean = torch.mean(train, dim=0, dtype=torch.float64)
    eps = torch.finfo(train.dtype if torch.is_floating_point(train) else torch.float32).eps
    if d <= n:
        eigenvalues, vectors = torch.linalg.eigh(_scatter(train, mean))
        method = "covariance"
    else:
        gram = _cross(train, mean, train)
        eigenvalues, vectors = torch.linalg.eigh(gram)
        method = "gram"
    sigma, kept, record = _support(eigenvalues, n, d, eps)
    vectors = vectors[:, kept]
    if method == "covariance":
        projection = vectors * (n**0.5 / sigma)  # V Λ^{-1/2}, with Λ = S² / N

        def apply(x: torch.Tensor) -> torch.Tensor:
            return _centred_product(x, mean, projection, dtype)
        z_train = apply(train)
    else:
        coefficients = vectors * (n**0.5 / sigma**2)  # U S⁻² √N

        def apply(x: torch.Tensor) -> torch.Tensor:
            return (_cross(x, mean, train) @ coefficients).to(dtype)
        z_train = (gram @ coefficients).to(dtype)
    return [z_train, *(None if x is None else apply(x) for x in others)], record | {"method": method}


def _support(eigenvalues: torch.Tensor, n: int, d: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Eigenvalues of the centred train matrix's scatter (or Gram) matrix -> (the kept singular values σ, which
    are kept (a mask), the record's rank, tolerance, rule, n, dim); see the module docstring for the rule."""
    sigma = eigenvalues.clamp_min(0).sqrt()
    sigma_max = float(sigma.max())
    size = max(n, d)
    tolerance = max(sigma_max * size * eps, sigma_max * (size * torch.finfo(torch.float64).eps) ** 0.5)
    kept = sigma > tolerance
    if not kept.any():
        raise ValueError("the training features are constant (no direction varies above rounding), so there is "
                         "nothing to whiten; check that the tap's features were extracted.")
    return sigma[kept], kept, {
        "rank": int(kept.sum()), "tolerance": tolerance, "sigma_max": sigma_max,
        "rule": "sigma > max(sigma_max * max(N, D) * eps(input dtype), sigma_max * sqrt(max(N, D) * eps64))",
        "n": n, "dim": d}


def whitening_of_rows(rows: Rows) -> tuple[Whitening, dict]:
    """`whiten`'s map for a tap read block by block (`Rows`, no map yet): the float64 mean and projection (D, r),
    for the probe to fold into its weights rather than store whitened rows; same support rule and record (with
    "blocks": rows per block). D ≤ N: the scatter matrix, summed over row blocks. D > N: the Gram matrix, from pairs
    of row blocks, and the projection (x − μ)ᵀ U S⁻² √N summed over row blocks."""
    n, d = len(rows), rows.dim
    if n < 2:
        raise ValueError(f"whitening needs at least 2 training rows to estimate a covariance but got {n}.")
    dtype = rows.source.dtype
    eps = torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps
    total = torch.zeros(d, dtype=torch.float64, device=rows.device)
    for _, block in rows.blocks():
        total += block.sum(dim=0, dtype=torch.float64)
    mean = total / n

    def centred():
        for start, block in rows.blocks():
            yield start, block.to(torch.float64) - mean

    if d <= n:
        scatter = torch.zeros(d, d, dtype=torch.float64, device=rows.device)
        for _, block in centred():
            scatter.addmm_(block.T, block)
        eigenvalues, vectors = torch.linalg.eigh(scatter)
        sigma, kept, record = _support(eigenvalues, n, d, eps)
        projection = vectors[:, kept] * (n**0.5 / sigma)  # V Λ^{-1/2}, with Λ = S² / N
        method = "covariance"
    else:
        gram = torch.zeros(n, n, dtype=torch.float64, device=rows.device)
        for start, block in centred():
            for other_start, other in centred():
                gram[start : start + len(block), other_start : other_start + len(other)] = block @ other.T
        eigenvalues, vectors = torch.linalg.eigh(gram)
        del gram
        sigma, kept, record = _support(eigenvalues, n, d, eps)
        coefficients = vectors[:, kept] * (n**0.5 / sigma**2)  # U S⁻² √N
        projection = torch.zeros(d, len(sigma), dtype=torch.float64, device=rows.device)
        for start, block in centred():
            projection.addmm_(block.T, coefficients[start : start + len(block)])
        method = "gram"
    return Whitening(mean, projection), record | {"method": method, "blocks": rows.block_rows}


def _scatter(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """float64 (x − μ)ᵀ(x − μ): (D, D), summed over row blocks of x converted as they are read."""
    out = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
    step = max(1, _BLOCK_ENTRIES // x.shape[1])
    for start in range(0, x.shape[0], step):
        block = x[start : start + step].to(torch.float64) - mean
        out.addmm_(block.T, block)
    return out


def _cross(x: torch.Tensor, mean: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    """float64 (x − μ)(train − μ)ᵀ: (M, N), summed over column blocks of both converted as they are read."""
    out = torch.zeros(x.shape[0], train.shape[0], dtype=torch.float64, device=x.device)
    step = max(1, _BLOCK_ENTRIES // (x.shape[0] + train.shape[0]))
    for start in range(0, x.shape[1], step):
        columns = slice(start, start + step)
        left = x[:, columns].to(torch.float64) - mean[columns]
        out.addmm_(left, (train[:, columns].to(torch.float64) - mean[columns]).T)
    return out


def _centred_product(x: torch.Tensor, mean: torch.Tensor, projection: torch.Tensor,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(x − μ) P: (M, r) in `dtype`, each row block of x converted to float64 as it is read and stored rounded."""
    out = torch.empty(x.shape[0], projection.shape[1], dtype=dtype, device=x.device)
    step = max(1, _BLOCK_ENTRIES // x.shape[1])
    for start in range(0, x.shape[0], step):
        out[start : start + step] = (x[start : start + step].to(torch.float64) - mean) @ projection
    return out
