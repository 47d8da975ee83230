"""The probes a recipe names, applied uniformly to every tap.

Each registered probe takes a `TapData` (what one tap offers: clean train/test features, and
when heads are trained, the features of the cached augmented views and of rotated images) and
returns a `ProbeOutput` with flat metrics and the protocol that produced them. A probe that needs
data the run does not have (views without heads, say) says so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TapData:
    """What one tap offers. Shapes: train_x (N, D), test_x (M, D), views (N_v, K, D) with
    view_params (N_v, K, P), rotated_train_x (4N', D) with rotated_train_y in {0,1,2,3},
    orbits {sweep: (N_o, T, D)} (test images along each augmentation sweep)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    n_classes: int
    seed: int = 0
    val_fraction: float = 0.2
    views: torch.Tensor | None = None
    view_params: torch.Tensor | None = None
    rotated_train_x: torch.Tensor | None = None
    rotated_train_y: torch.Tensor | None = None
    rotated_test_x: torch.Tensor | None = None
    rotated_test_y: torch.Tensor | None = None
    orbits: dict[str, torch.Tensor] | None = None


@dataclass
class ProbeOutput:
    metrics: dict[str, float]
    protocol: dict = field(default_factory=dict)


class MissingInputError(ValueError):
    """A probe asked for data this run does not produce; the message says which recipe key adds it."""


def _need_views(tap: TapData, probe: str) -> torch.Tensor:
    if tap.views is None:
        raise MissingInputError(
            f"probe {probe!r} measures augmented views, which exist only when the recipe trains heads "
            "(add a `heads:` section) — or remove probes." + probe + "."
        )
    return tap.views


def linear(tap: TapData, **options) -> ProbeOutput:
    """Linear probe (class accuracy) and the label-MI lower bound I(Z;Y) ≥ H(Y) − CE of that probe, in nats."""
    from .information import label_mi_lower_bound
    from .linear import linear_probe

    result = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, val_fraction=tap.val_fraction,
                          seed=tap.seed, **options)
    bound = label_mi_lower_bound(result.probabilities, tap.test_y)
    metrics = dict(result.metrics) | {"mi.label": bound["mi_lower_bound"]}
    protocol = result.protocol | {"mi.label": {k: v for k, v in bound.items() if k != "mi_lower_bound"}}
    return ProbeOutput(metrics, protocol)


def knn(tap: TapData, **options) -> ProbeOutput:
    from .knn import knn as knn_probe

    result = knn_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, num_classes=tap.n_classes, **options)
    return ProbeOutput(dict(result.metrics), result.protocol)


def spectrum(tap: TapData, top_k: int | None = None) -> ProbeOutput:
    """RankMe, α-ReQ and the covariance spectrum of the clean training features (honest conditioning)."""
    from .spectrum import alpha_req, covariance_spectrum, rankme

    spec = covariance_spectrum(tap.train_x, top_k=top_k)
    metrics = {"rankme": rankme(tap.train_x), "alpha_req": alpha_req(tap.train_x),
               "cond": spec["condition_number"], "eff_rank": spec["effective_rank"]}
    protocol = {k: spec[k] for k in ("n_samples", "dim", "rank_limit", "numerical_rank", "top_k",
                                     "condition_number_scope", "note")}
    return ProbeOutput(metrics, protocol | {"eigenvalues_top": list(spec["eigenvalues"][:64])})


def invariance(tap: TapData, uniformity_t: float = 2.0) -> ProbeOutput:
    """Alignment, uniformity, view cosine (first two views of each image) and LiDAR over all views."""
    from .spectrum import alignment, lidar, uniformity, view_cosine

    views = _need_views(tap, "invariance")
    z1, z2 = views[:, 0], views[:, 1]
    metrics = {"align": alignment(z1, z2), "uniform": uniformity(z1, t=uniformity_t),
               "view_cos": view_cosine(z1, z2), "lidar": lidar(views)}
    return ProbeOutput(metrics, {"pairs": "views 0 and 1 of each image", "n_images": len(views),
                                 "views": views.shape[1], "uniformity_t": uniformity_t})


def view_mi(tap: TapData, batch_size: int = 128, temperature: float = 0.1, pca_dims: int = 32,
            critic: str = "cosine", critic_steps: int = 400) -> ProbeOutput:
    """MI between two views of an image: InfoNCE (ceiling log B) with the fixed cosine critic or a trained
    separable critic (held-out pairs), and the Gaussian (CCA) closed form on the top `pca_dims` principal
    components, fitted on the views themselves."""
    from .information import gaussian_mi, mutual_information

    views = _need_views(tap, "view_mi")
    z1, z2 = views[:, 0].double(), views[:, 1].double()
    batch = min(batch_size, len(z1))
    options = {"temperature": temperature} if critic == "cosine" else {"steps": critic_steps}
    nce = mutual_information(z1, z2, method="infonce", critic=critic, batch_size=batch, seed=tap.seed, **options)
    both = torch.cat([z1, z2])
    k = min(pca_dims, both.shape[1], len(z1) // 10 or 1)
    mean = both.mean(0)
    _, _, v = torch.linalg.svd(both - mean, full_matrices=False)
    basis = v[:k].T
    gauss = gaussian_mi((z1 - mean) @ basis, (z2 - mean) @ basis)
    metrics = {"mi.infonce": nce["mi"], "mi.infonce.ceiling": nce["ceiling"], "mi.gaussian": gauss["mi"]}
    protocol = {"infonce": {k2: v2 for k2, v2 in nce.items() if k2 != "mi"},
                "gaussian": {"pca_dims": k, "shrinkage": gauss["shrinkage"], "warning": gauss["warning"],
                             "n_samples": gauss["n_samples"]}}
    return ProbeOutput(metrics, protocol)


def augment_r2(tap: TapData, alpha: float = 1.0, test_fraction: float = 0.25) -> ProbeOutput:
    """How much of each augmentation parameter a view's representation keeps: ridge regression R² on
    held-out images (split by image, so no image's views are on both sides)."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.preprocessing import StandardScaler

    from ..data.augment import PARAM_NAMES

    views = _need_views(tap, "augment_r2")
    n, k, d = views.shape
    order = torch.randperm(n, generator=torch.Generator().manual_seed(tap.seed))
    n_test = max(1, int(round(test_fraction * n)))
    test_idx, train_idx = order[:n_test], order[n_test:]
    x_tr = views[train_idx].reshape(-1, d).double().numpy()
    x_te = views[test_idx].reshape(-1, d).double().numpy()
    scaler = StandardScaler().fit(x_tr)
    x_tr, x_te = scaler.transform(x_tr), scaler.transform(x_te)
    params = tap.view_params
    metrics, used = {}, []
    for j, name in enumerate(PARAM_NAMES):
        y_tr = params[train_idx, :, j].reshape(-1).double().numpy()
        y_te = params[test_idx, :, j].reshape(-1).double().numpy()
        if y_tr.std() < 1e-9 or y_te.std() < 1e-9:
            continue  # this preset never varies the parameter
        pred = Ridge(alpha=alpha).fit(x_tr, y_tr).predict(x_te)
        metrics[f"aug_r2.{name}"] = float(r2_score(y_te, pred))
        used.append(name)
    if used:
        metrics["aug_r2.mean"] = sum(metrics[f"aug_r2.{p}"] for p in used) / len(used)
    return ProbeOutput(metrics, {"model": "ridge", "alpha": alpha, "standardize": True, "params": used,
                                 "n_train_images": len(train_idx), "n_test_images": n_test, "views": k})


def rotation(tap: TapData, C_grid: list[float] | None = None, mlp_hidden: int = 256, mlp_epochs: int = 100
             ) -> ProbeOutput:
    """4-way rotation prediction (0/90/180/270°, chance 0.25) from each tap: a linear (logistic) probe with
    C chosen on validation, and a one-hidden-layer MLP probe — the paper's "guillotine" measurement."""
    from .linear import linear_probe

    if tap.rotated_train_x is None:
        raise MissingInputError("probe 'rotation' needs rotated images; the pipeline extracts them when "
                                "probes.rotation is in the recipe.")
    kwargs = {"C_grid": C_grid} if C_grid else {}
    lin = linear_probe(tap.rotated_train_x, tap.rotated_train_y, tap.rotated_test_x, tap.rotated_test_y,
                       val_fraction=tap.val_fraction, seed=tap.seed, **kwargs)
    mlp_acc = _mlp_probe(tap, mlp_hidden, mlp_epochs)
    return ProbeOutput({"rotation.acc": lin.metrics["linear.acc"], "rotation.mlp.acc": mlp_acc},
                       {"linear": lin.protocol, "mlp": {"hidden": mlp_hidden, "epochs": mlp_epochs,
                                                         "optimizer": "adam lr 1e-3, full batch", "standardize": True},
                        "chance": 0.25})


def _mlp_probe(tap: TapData, hidden: int, epochs: int) -> float:
    x, y = tap.rotated_train_x.float(), tap.rotated_train_y
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    g = torch.Generator().manual_seed(tap.seed)
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    xs = (x - mean) / std
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xs), y).backward()
        opt.step()
    with torch.no_grad():
        pred = net((tap.rotated_test_x.float() - mean) / std).argmax(1)
    return (pred == tap.rotated_test_y).float().mean().item()


def orbits(tap: TapData, sweeps: list[str] | None = None, n_images: int = 64, pca_images: int = 8) -> ProbeOutput:
    """Orbit geometry along each augmentation sweep (see `probes.orbits`), raw and scale-free, in the
    space the head was trained on (unnormalised taps); metrics are prefixed by the sweep name."""
    from .orbits import orbit_measures, orbit_pca, sweep_values

    if tap.orbits is None:
        raise MissingInputError("probe 'orbits' needs orbit features; the pipeline extracts them when "
                                "probes.orbits is in the recipe.")
    metrics, protocol = {}, {"n_images": n_images, "sweeps": {}}
    for sweep, traj in tap.orbits.items():
        try:
            out = orbit_measures(traj.double(), sweep=sweep)
        except ValueError as err:  # e.g. a hue sweep on grey images: record why, keep the other sweeps
            protocol["sweeps"][sweep] = {"skipped": str(err)}
            continue
        space = out.pop("space")
        metrics |= {f"{sweep}.{k}": float(v) for k, v in out.items()}
        protocol["sweeps"][sweep] = {"values": sweep_values(sweep, traj.shape[1]), "space": space,
                                     "pca": orbit_pca(traj.double(), n_images=pca_images).round(5).tolist()}
    return ProbeOutput(metrics, protocol)
