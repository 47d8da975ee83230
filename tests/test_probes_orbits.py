import itertools
import math

import numpy as np
import pytest
import torch
from PIL import Image

from headprobe.probes import orbits
from headprobe.probes.orbits import (
    ORBIT_SWEEPS,
    anchor_index,
    orbit_images,
    orbit_measures,
    orbit_pca,
    sweep_values,
    trajectory_curvature,
)

SCALE_FREE = (
    "orbit.spread_rel",
    "orbit.d_intra_rel",
    "orbit.d_ratio",
    "orbit.d_ratio_image",
    "orbit.curvature",
    "orbit.cos_anchor",
    "orbit.eff_rank",
)


pytestmark = pytest.mark.usefixtures("single_thread")


def circle(radius, angles, plane, centre):
    """(T, D) points centre + radius (cos θ u + sin θ v) for plane = (u, v) orthonormal."""
    u, v = plane
    return centre + radius * (angles.cos()[:, None] * u + angles.sin()[:, None] * v)


def random_plane(d, seed):
    q, _ = torch.linalg.qr(torch.randn(d, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q[:, 0], q[:, 1]


def pixels(image):
    return np.asarray(image).astype(np.int64)


# ---- measures ---------------------------------------------------------------------------------------------


def test_circle_orbits_match_closed_forms():
    n, t, r, d = 3, 12, 0.7, 9
    eye = torch.eye(d, dtype=torch.float64)
    angles = torch.arange(t, dtype=torch.float64) * 2 * math.pi / t
    # image k: a circle in the plane (e_{3+2k}, e_{4+2k}) around the centre 10 e_k; centres are 10√2 apart
    traj = torch.stack([circle(r, angles, (eye[3 + 2 * k], eye[4 + 2 * k]), 10 * eye[k]) for k in range(n)])
    m = orbit_measures(traj, labels=torch.tensor([0, 1, 2]))  # one image per class: both D_inter agree
    # mean chord over the T−1 other points: (1/(T−1)) Σ_k 2r sin(πk/T) = 2r cot(π/2T) / (T−1)
    d_intra = 2 * r / math.tan(math.pi / (2 * t)) / (t - 1)
    assert m["orbit.spread"] == pytest.approx(r**2, rel=1e-12)
    assert m["orbit.d_intra"] == pytest.approx(d_intra, rel=1e-12)
    for suffix in ("", "_image"):
        assert m["orbit.d_inter" + suffix] == pytest.approx(10 * math.sqrt(2), rel=1e-12)
        assert m["orbit.d_ratio" + suffix] == pytest.approx(10 * math.sqrt(2) / d_intra, rel=1e-12)
    assert m["orbit.pair_sq_dist"] == pytest.approx(200 + 2 * r**2, rel=1e-12)
    assert m["orbit.spread_rel"] == pytest.approx(r**2 / (200 + 2 * r**2), rel=1e-12)
    assert m["orbit.eff_rank"] == pytest.approx(2.0, rel=1e-9)
    assert "raw" in m["space"]


def test_curvature_closed_forms():
    plane = random_plane(7, seed=1)
    # a circle around the origin normalises onto a great circle: every second difference is 2(1 − cos Δ)
    arc = torch.deg2rad(torch.linspace(0, 45, 10, dtype=torch.float64))
    traj = torch.stack([circle(3.0, arc, plane, 0.0), circle(0.5, arc + 1, plane, 0.0)])
    assert trajectory_curvature(traj) == pytest.approx(2 * (1 - math.cos(math.radians(5))), rel=1e-10)
    full = torch.arange(12, dtype=torch.float64) * math.pi / 6
    loop = torch.stack([circle(3.0, full, plane, 0.0), circle(2.0, full + 0.3, plane, 0.0)])
    expected = 2 * (1 - math.cos(math.pi / 6))
    assert orbit_measures(loop, sweep="rotation360")["orbit.curvature"] == pytest.approx(expected, rel=1e-10)
    assert orbit_measures(loop, sweep="rotation45")["orbit.curvature"] == pytest.approx(expected, rel=1e-10)
    # uniform steps along a straight line: zero raw curvature; unequal steps are not
    steps = torch.arange(6, dtype=torch.float64)[:, None]
    start, direction = torch.randn(2, 2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    line = start[:, None] + steps * direction[:, None]
    assert trajectory_curvature(line, on_sphere=False) == pytest.approx(0.0, abs=1e-12)
    assert trajectory_curvature(line**2, on_sphere=False) > 0.1
    # a ray through the origin is one point on the sphere
    assert trajectory_curvature((steps + 1) * direction[:, None], on_sphere=True) == pytest.approx(0.0, abs=1e-12)


def test_class_and_image_centroids_give_different_d_inter():
    """The paper's D_inter, in its words: the mean distance between the class centroids (not the orbit centroids)."""
    n, t, r, d = 4, 12, 0.5, 12
    eye = torch.eye(d, dtype=torch.float64)
    angles = torch.arange(t, dtype=torch.float64) * 2 * math.pi / t
    # class 0: images around 0 and 4 e_0; class 1: around 10 e_1 and 10 e_1 + 4 e_0
    centres = [0 * eye[0], 4 * eye[0], 10 * eye[1], 10 * eye[1] + 4 * eye[0]]
    traj = torch.stack([circle(r, angles, (eye[4 + 2 * k], eye[5 + 2 * k]), centres[k]) for k in range(n)])
    m = orbit_measures(traj, labels=torch.tensor([0, 0, 1, 1]))
    d_intra = 2 * r / math.tan(math.pi / (2 * t)) / (t - 1)
    # class centroids 2 e_0 and 10 e_1 + 2 e_0 are 10 apart; the six image-centroid distances are 4, 10, √116 twice each
    assert m["orbit.d_intra"] == pytest.approx(d_intra, rel=1e-12)
    assert m["orbit.d_inter"] == pytest.approx(10.0, rel=1e-12)
    assert m["orbit.d_ratio"] == pytest.approx(10.0 / d_intra, rel=1e-12)
    assert m["orbit.d_inter_image"] == pytest.approx((28 + 2 * math.sqrt(116)) / 6, rel=1e-12)
    assert m["orbit.d_ratio_image"] == pytest.approx((28 + 2 * math.sqrt(116)) / 6 / d_intra, rel=1e-12)
    assert "2 class centroids" in m["centroids"] and "4 image-orbit centroids" in m["centroids"]


def test_class_d_inter_matches_numpy_with_unequal_classes():
    g = torch.Generator().manual_seed(9)
    traj = torch.randn(6, 5, 7, generator=g, dtype=torch.float64) + 3 * torch.randn(6, 1, 7, generator=g)
    labels = np.array([9, 3, 7, 9, 3, 9])  # classes of 1, 2 and 3 images, out of order
    x = traj.numpy()
    nu = [x[labels == c].reshape(-1, 7).mean(axis=0) for c in np.unique(labels)]
    d_inter = np.mean([np.linalg.norm(a - b) for a, b in itertools.permutations(nu, 2)])
    for given in (labels, torch.as_tensor(labels)):
        m = orbit_measures(traj, labels=given)
        assert m["orbit.d_inter"] == pytest.approx(d_inter, rel=1e-12)
        assert m["orbit.d_ratio"] == pytest.approx(d_inter / m["orbit.d_intra"], rel=1e-12)
    assert abs(m["orbit.d_inter"] - m["orbit.d_inter_image"]) > 0.1 * m["orbit.d_inter"]


def test_without_labels_the_papers_d_inter_is_absent():
    traj = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    m = orbit_measures(traj)
    assert "orbit.d_inter" not in m and "orbit.d_ratio" not in m
    assert "orbit.d_inter_image" in m and "absent" in m["centroids"]
    with pytest.raises(ValueError, match="all of class 3.*needs >= 2 classes"):
        orbit_measures(traj, labels=torch.full((4,), 3))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        orbit_measures(traj, labels=torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="integer"):
        orbit_measures(traj, labels=torch.tensor([0.0, 1.0, 0.0, 1.0]))


def test_orbits_probe_names_the_class_and_image_versions():
    from headprobe.probes.builtin.orbits import ORBITS as orbits_probe
    from headprobe.probes.tap_data import TapData

    traj = torch.randn(4, 10, 3, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    empty = torch.zeros(0, 3)

    def probe(labels):
        tap = TapData("t", empty, torch.zeros(0), empty, torch.zeros(0), 2, orbits={"rotation45": traj},
                      orbit_labels=labels)
        return orbits_probe(tap)

    labelled = probe(torch.tensor([0, 1, 0, 1]))
    direct = orbit_measures(traj, sweep="rotation45", labels=torch.tensor([0, 1, 0, 1]))
    for key in ("orbit.d_inter", "orbit.d_ratio", "orbit.d_inter_image", "orbit.d_ratio_image"):
        assert labelled.metrics["rotation45." + key] == direct[key], key
    assert "2 class centroids" in labelled.protocol["centroids"]
    for labels, reason in ((None, "without labels"), (torch.tensor([5, 5, 5, 5]), "all of class 5")):
        out = probe(labels)
        assert "rotation45.orbit.d_inter" not in out.metrics and "rotation45.orbit.d_ratio" not in out.metrics
        assert out.metrics["rotation45.orbit.d_inter_image"] == direct["orbit.d_inter_image"]
        assert reason in out.protocol["centroids"], out.protocol


def brute_force(traj, anchor, labels):
    x = traj.numpy()
    n, t, _ = x.shape
    mu = x.mean(axis=1)
    spread = np.mean([np.mean([np.sum((x[i, s] - mu[i]) ** 2) for s in range(t)]) for i in range(n)])
    d_intra = np.mean(
        [np.linalg.norm(x[i, a] - x[i, b]) for i in range(n) for a in range(t) for b in range(t) if a != b]
    )
    d_inter_image = np.mean([np.linalg.norm(mu[i] - mu[j]) for i in range(n) for j in range(n) if i != j])
    classes = sorted(set(labels))
    nu = [np.mean([x[i, s] for i in range(n) if labels[i] == c for s in range(t)], axis=0) for c in classes]
    d_inter = np.mean([np.linalg.norm(nu[a] - nu[b]) for a in range(len(nu)) for b in range(len(nu)) if a != b])
    between = [x[i, a] - x[j, b] for i in range(n) for j in range(n) if i != j for a in range(t) for b in range(t)]
    pair_sq = np.mean([np.sum(v**2) for v in between])
    pair = np.mean([np.linalg.norm(v) for v in between])
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    curvature = np.mean(
        [np.linalg.norm(u[i, s + 1] - 2 * u[i, s] + u[i, s - 1]) for i in range(n) for s in range(1, t - 1)]
    )
    cos = np.mean([u[i, s] @ u[i, anchor] for i in range(n) for s in range(t) if s != anchor])
    ranks = []
    for i in range(n):
        sv = np.linalg.svd(x[i] - mu[i], compute_uv=False)
        p = sv / sv.sum()
        ranks.append(np.exp(-np.sum(p * np.log(p))))
    return {
        "orbit.spread": spread,
        "orbit.spread_rel": spread / pair_sq,
        "orbit.d_intra": d_intra,
        "orbit.d_intra_rel": d_intra / pair,
        "orbit.d_inter": d_inter,
        "orbit.d_ratio": d_inter / d_intra,
        "orbit.d_inter_image": d_inter_image,
        "orbit.d_ratio_image": d_inter_image / d_intra,
        "orbit.pair_sq_dist": pair_sq,
        "orbit.pair_dist": pair,
        "orbit.curvature": curvature,
        "orbit.cos_anchor": cos,
        "orbit.eff_rank": np.mean(ranks),
    }


def test_measures_match_brute_force_in_several_blocks(monkeypatch):
    traj = torch.randn(5, 5, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 1.0
    monkeypatch.setattr(orbits, "_PAIR_BLOCK", 2 * 5 * 5 * 5)  # blocks of 2 images: 2 + 2 + 1
    labels = [0, 1, 1, 0, 2]
    m = orbit_measures(traj, sweep="hue", labels=torch.tensor(labels))
    expected = brute_force(traj, anchor=2, labels=labels)
    assert set(m) == set(expected) | {"space", "centroids"}
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-10), key


def test_scaling_everything_moves_only_the_raw_numbers():
    traj = torch.randn(6, 10, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    base, scaled = orbit_measures(traj, labels=labels), orbit_measures(10 * traj, labels=labels)
    assert scaled["orbit.spread"] == pytest.approx(100 * base["orbit.spread"], rel=1e-12)
    assert scaled["orbit.pair_sq_dist"] == pytest.approx(100 * base["orbit.pair_sq_dist"], rel=1e-12)
    for key in ("orbit.d_intra", "orbit.d_inter", "orbit.d_inter_image"):
        assert scaled[key] == pytest.approx(10 * base[key], rel=1e-12), key
    for key in SCALE_FREE:
        assert scaled[key] == pytest.approx(base[key], rel=1e-10), key


def test_uniform_shrinking_is_not_invariance():
    traj = torch.randn(6, 10, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    base = orbit_measures(traj)
    # the normalisation artefact: everything shrinks, orbits and the distances between images alike
    shrunk = orbit_measures(0.1 * traj)
    assert shrunk["orbit.spread"] == pytest.approx(0.01 * base["orbit.spread"], rel=1e-12)
    assert shrunk["orbit.spread_rel"] == pytest.approx(base["orbit.spread_rel"], rel=1e-12)
    # real invariance: each orbit shrinks towards its own centroid, the images stay apart
    centroids = traj.mean(dim=1, keepdim=True)
    invariant = orbit_measures(centroids + 0.1 * (traj - centroids))
    assert invariant["orbit.spread"] == pytest.approx(0.01 * base["orbit.spread"], rel=1e-12)
    assert invariant["orbit.spread_rel"] < 0.1 * base["orbit.spread_rel"]
    assert invariant["orbit.d_ratio_image"] > 5 * base["orbit.d_ratio_image"]


def test_normalize_measures_on_the_sphere():
    g = torch.Generator().manual_seed(6)
    traj = torch.randn(4, 5, 6, generator=g, dtype=torch.float64) * torch.rand(
        4, 5, 1, generator=g, dtype=torch.float64
    )
    labels = torch.tensor([1, 0, 1, 0])
    on_sphere = orbit_measures(traj, normalize=True, labels=labels)
    expected = orbit_measures(traj / traj.norm(dim=-1, keepdim=True), labels=labels)
    assert "orbit.d_inter" in expected
    for key, value in expected.items():
        if key not in ("space", "centroids"):
            assert on_sphere[key] == pytest.approx(value, rel=1e-12), key
    assert orbit_measures(7 * traj, normalize=True)["orbit.spread"] == pytest.approx(on_sphere["orbit.spread"])
    assert "l2-normalised" in on_sphere["space"] and on_sphere["space"] != expected["space"]


def test_a_point_orbit_has_rank_zero_and_errors_are_sentences():
    traj = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    traj[1] = traj[1, :1]  # image 1 does not move: its orbit spans no direction
    moving = orbit_measures(traj[[0, 2]])["orbit.eff_rank"]
    assert orbit_measures(traj)["orbit.eff_rank"] == pytest.approx(moving * 2 / 3, rel=1e-12)
    with pytest.raises(ValueError, match="no orbit in traj moves"):
        orbit_measures(traj[:, :1].expand(3, 4, 5))
    traj[0, 2] = 0
    with pytest.raises(ValueError, match=r"traj\[0, 2\] is all zeros"):
        orbit_measures(traj)
    with pytest.raises(ValueError, match="3-D"):
        orbit_measures(traj[0])
    with pytest.raises(ValueError, match="T >= 3"):
        orbit_measures(traj[:, :2])
    with pytest.raises(ValueError, match="odd number of steps"):
        orbit_measures(traj, sweep="hue")


def test_orbit_pca_is_an_isometry_of_planar_orbits():
    plane = random_plane(6, seed=8)
    angles = torch.arange(7, dtype=torch.float64) * 0.4
    traj = torch.stack([circle(1.0 + k, angles + k, plane, 0.0) + 2.0 for k in range(3)])
    coords = orbit_pca(traj, n_images=8)
    assert coords.shape == (3, 7, 2) and coords.dtype == np.float64
    flat, points = coords.reshape(-1, 2), traj.reshape(-1, 6).numpy()
    for a, b in itertools.combinations(range(len(flat)), 2):
        assert np.linalg.norm(flat[a] - flat[b]) == pytest.approx(np.linalg.norm(points[a] - points[b]), abs=1e-9)
    np.testing.assert_allclose(orbit_pca(-traj), coords, atol=1e-9)  # signs are fixed, not the SVD's choice
    assert orbit_pca(traj, n_images=2).shape == (2, 7, 2)


# ---- sweeps and images ------------------------------------------------------------------------------------


def test_sweep_values_and_anchors():
    assert sweep_values("rotation45") == [5.0 * k for k in range(10)]
    assert sweep_values("rotation360") == [30.0 * k for k in range(12)]
    assert sweep_values("hue")[0] == -0.5 and sweep_values("hue")[-1] == 0.5 and sweep_values("hue")[5] == 0.0
    assert sweep_values("blur") == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert sweep_values("rotation360", 4) == [0.0, 90.0, 180.0, 270.0]
    assert {name: anchor_index(name) for name in ORBIT_SWEEPS} == {
        "rotation45": 0,
        "rotation360": 0,
        "hue": 5,
        "saturation": 5,
        "blur": 0,
    }
    with pytest.raises(ValueError, match="odd number of steps"):
        sweep_values("saturation", 10)
    with pytest.raises(ValueError, match=">= 3"):
        sweep_values("blur", 2)


def test_bad_sweep_name_suggests_the_closest():
    with pytest.raises(ValueError, match=r"unknown orbit sweep 'rotaton45'.*Did you mean 'rotation45'\?"):
        orbit_images(Image.new("RGB", (8, 8)), "rotaton45")
    with pytest.raises(ValueError, match="Did you mean 'hue'"):
        sweep_values("hues")


def test_rotation_orbit_of_a_four_fold_symmetric_image():
    base = np.random.default_rng(0).integers(0, 64, (16, 16, 3))
    symmetric = sum(np.rot90(base, k) for k in range(4)).astype(np.uint8)
    image = Image.fromarray(symmetric)
    orbit = orbit_images(image, "rotation360")
    assert len(orbit) == 12 and all(im.size == (16, 16) and im.mode == "RGB" for im in orbit)
    for k in (0, 3, 6, 9):  # 0, 90, 180, 270 degrees
        np.testing.assert_array_equal(pixels(orbit[k]), symmetric)
    assert np.abs(pixels(orbit[1]) - symmetric).max() > 0
    again = orbit_images(image, "rotation360")
    assert all(np.array_equal(pixels(a), pixels(b)) for a, b in zip(orbit, again, strict=True))
    np.testing.assert_array_equal(pixels(orbit_images(image, "rotation45")[0]), symmetric)


def test_rotation_keeps_size_and_blackens_corners():
    white = Image.new("L", (20, 12), 255)
    turned = orbit_images(white, "rotation45")[-1]
    assert turned.size == (20, 12) and turned.mode == "RGB"
    assert pixels(turned)[0, 0].tolist() == [0, 0, 0] and pixels(turned)[6, 10].tolist() == [255, 255, 255]


def test_colour_sweeps_endpoints():
    red = Image.new("RGB", (6, 6), (255, 0, 0))
    hue = orbit_images(red, "hue")
    assert pixels(hue[5])[0, 0].tolist() == [255, 0, 0]
    assert pixels(hue[0])[0, 0].tolist() == pixels(hue[-1])[0, 0].tolist() == [0, 255, 255]  # half a turn: cyan
    saturation = orbit_images(red, "saturation", steps=3)
    grey = pixels(saturation[0])[0, 0]
    assert grey[0] == grey[1] == grey[2] and pixels(saturation[1])[0, 0].tolist() == [255, 0, 0]


def test_blur_orbit_smooths_monotonically():
    bars = Image.fromarray(np.tile((np.arange(24) // 4 % 2 * 255).astype(np.uint8), (24, 1))).convert("RGB")
    blurred = orbit_images(bars, "blur")
    np.testing.assert_array_equal(pixels(blurred[0]), pixels(bars))
    contrast = [pixels(im).std() for im in blurred]
    assert all(np.diff(contrast) < 0) and contrast[-1] < 0.3 * contrast[0]
    flat = orbit_images(Image.new("RGB", (5, 5), (10, 20, 30)), "blur")
    assert all(pixels(im).reshape(-1, 3).tolist() == [[10, 20, 30]] * 25 for im in flat)
