
import numpy as np
import pytest
from report_run import results_dict, train_records, write_run

from headprobe.report.geometry_plots import orbit_pca
from headprobe.report.plots import (
    head_out_dims,
    plan_plots,
    read_records,
    render_plots,
    train_history,
    write_plots,
)
from headprobe.train.heads import ProjectionHead

ALL_FIGURES = {"tap_heatmap", "metric_bars", "training_curves", "objective_terms", "optimisation",
               "lambda_over_training", "hessian_density", "pullback_spectrum", "feature_spectra", "orbit_pca"}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("run") / "r")
    return run_dir, write_plots(run_dir)


def test_every_figure_the_data_supports_is_drawn_as_a_png(drawn):
    from PIL import Image

    run_dir, paths = drawn
    assert {p.stem for p in paths} == ALL_FIGURES
    assert sorted(paths) == sorted((run_dir / "plots").glob("*.png"))
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 250


def test_figures_without_their_data_are_left_out():
    results = results_dict()
    bare = {**results, "orbits": None, "heads": {h: {**v, "geometry": {}} for h, v in results["heads"].items()},
            "taps": {t: {**v, "protocol": {}} for t, v in results["taps"].items()}}
    assert [p.name for p, _ in plan_plots(bare, [])] == ["tap_heatmap", "metric_bars"]
    no_lambda = [r for r in train_records() if r["stage"] == "train"]  # no tracked geometry records
    names = [p.name for p, _ in plan_plots(bare, no_lambda)]
    assert names == ["tap_heatmap", "metric_bars", "training_curves", "objective_terms", "optimisation"]
    assert plan_plots({"taps": {}}, []) == []


def test_orbit_trajectories_per_sweep_get_one_figure_each(tmp_path):
    rng = np.random.default_rng(0)
    traj = {tap: rng.normal(size=(4, 12, 2)).tolist() for tap in ("backbone", "mlp")}  # (M images, T steps, 2)
    results = {"taps": {}, "orbits": {"rotation360": traj, "hue": {"backbone": rng.normal(size=(3, 5, 7)).tolist()}}}
    plots = render_plots(results, [], tmp_path)
    assert [(p.name, p.error) for p in plots] == [("orbit_pca_rotation360", None), ("orbit_pca_hue", None)]
    assert all(p.path.is_file() for p in plots)
    flat = {"taps": {}, "orbits": {"backbone": {"points": [[0.0, 1.0], [1.0, 0.0]], "orbit": [0, 0]}}}
    assert [p.name for p, _ in plan_plots(flat, [])] == ["orbit_pca"]


def test_a_broken_figure_is_recorded_and_the_others_still_drawn(tmp_path):
    results = {"taps": {"backbone": {"head": None, "depth": 0, "metrics": {"linear.acc": 0.9}},
                        "h": {"head": "h", "depth": 1, "metrics": {"linear.acc": 0.8}}},
               "heads": {"h": {"geometry": {"hessian_density": {"grid": [0.0, 1.0, 2.0], "density": [1.0, 2.0]}}}}}
    stale = tmp_path / "hessian_density.png"
    stale.write_bytes(b"an earlier run's figure")
    plots = {p.name: p for p in render_plots(results, [], tmp_path)}
    assert plots["hessian_density"].path is None and "3 points but density has 2" in plots["hessian_density"].error
    assert not stale.exists()
    assert plots["tap_heatmap"].path.is_file() and plots["metric_bars"].path.is_file()
    assert render_plots({"taps": ["not", "a", "dict"]}, [], tmp_path)[0].error.startswith("AttributeError")


def test_records_keep_the_last_of_a_repeated_step_and_skip_a_torn_line(tmp_path):
    records = train_records(steps=8, every=4)
    last_train = [r for r in records if r["stage"] == "train"][-1]
    resumed = {**last_train, "loss": -1.0}  # step 8 of "lin" logged again after a resume
    write_run(tmp_path, records=[*records, resumed], torn_line=True)
    read = read_records(tmp_path)
    assert len(read) == 4 + len(records) + 1  # 4 probe records, the torn line dropped
    history = train_history(read)
    assert list(history) == ["mlp", "lin"]
    assert [r["step"] for r in history["lin"]] == [4, 8] and history["lin"][-1]["loss"] == -1.0
    tracked = train_history(read, "geometry")
    assert [r["step"] for r in tracked["lin"]] == [8] and "lambda_min" in tracked["lin"][0]
    assert all("lambda_min" not in r for recs in history.values() for r in recs)


def test_lambda_plot_is_drawn_from_geometry_records_with_unconverged_points_hollow(tmp_path):
    from headprobe.report.geometry_plots import convergence_flags

    records = train_records()
    tracked = train_history(records, "geometry")
    assert convergence_flags(tracked["mlp"], "lambda_min") == [True, False, True, True, True]  # step 16 unconverged
    newer = [{**r, "lambda_min_converged": r["step"] == 8, "lambda_max_converged": True} for r in tracked["mlp"]]
    assert convergence_flags(newer, "lambda_min") == [True, False, False, False, False]  # each end's own key wins
    assert convergence_flags(newer, "lambda_max") == [True] * 5
    assert convergence_flags([{"lambda_min": -1.0, "converged": True}, {"lambda_max": 2.0}], "lambda_min") == [None]
    plots = {p.name: p for p in render_plots({"taps": {}}, records, tmp_path)}
    assert plots["lambda_over_training"].error is None and plots["lambda_over_training"].path.is_file()
    only_train = [r for r in records if r["stage"] == "train"]
    assert "lambda_over_training" not in [p.name for p, _ in plan_plots({"taps": {}}, only_train)]


def test_orbit_pca_matches_the_covariance_eigendecomposition():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)) * np.array([5.0, 2.0, 1.0, 0.5, 0.1, 0.1])
    xy, ids, explained = orbit_pca(x, np.arange(40) // 8)
    eigvals, eigvecs = np.linalg.eigh(np.cov(x.T))
    top = eigvecs[:, ::-1][:, :2]
    assert explained == pytest.approx((eigvals[::-1][:2] / eigvals.sum()).tolist(), rel=1e-9)
    assert np.allclose(np.abs(xy), np.abs((x - x.mean(0)) @ top))
    assert ids.tolist() == (np.arange(40) // 8).tolist()
    traj_xy, traj_ids, _ = orbit_pca(x.reshape(5, 8, 6))  # (M images, T steps, D): ids from the first axis
    assert np.allclose(traj_xy, xy) and traj_ids.tolist() == ids.tolist()
    flat, _, none = orbit_pca([[1.0, 2.0], [3.0, 4.0]])
    assert flat.tolist() == [[1.0, 2.0], [3.0, 4.0]] and none is None
    with pytest.raises(ValueError, match="3 orbit points but 2 orbit ids"):
        orbit_pca(np.zeros((3, 4)), [0, 1])


@pytest.mark.parametrize("config", [
    {"type": "mlp", "depth": 2, "width": 64, "out_dim": None},
    {"type": "mlp", "depth": 3, "width": 64, "out_dim": 16},
    {"type": "linear", "depth": 1, "width": 32, "out_dim": None},
    {"type": "identity", "depth": 2, "width": 64, "out_dim": None},
])
def test_head_out_dims_follow_the_projection_head_rule(config):
    results = {"backbone": {"dim": 24}, "heads": {"h": {"config": config}}}
    head = ProjectionHead(24, kind=config["type"], depth=config["depth"], width=config["width"],
                          out_dim=config["out_dim"])
    assert head_out_dims(results) == {"h": head.out_dim}



def test_relative_lambda_min_is_scale_free_and_keeps_the_collapse_flag_and_bound(tmp_path):
    from headprobe.report.geometry_plots import plot_lambda_over_training, relative_lambda_min

    records = [{"step": 1, "lambda_min": -2e-6, "lambda_max": 4e-3, "error_bound_min": 4e-7, "collapsed": True,
                "lambda_min_converged": True},
               {"step": 2, "lambda_min": -1e-9, "lambda_max": 2e-3, "collapsed": False, "lambda_min_converged": False},
               {"step": 3, "lambda_min": -1.0, "lambda_max": 0.0},  # no positive scale: left out
               {"step": 4, "lambda_min": 1e-3, "lambda_max": 1e-2}]  # written before the flag
    r = relative_lambda_min(records)
    assert r["step"] == [1, 2, 4]
    assert r["ratio"] == pytest.approx([-5e-4, -5e-7, 0.1])
    assert r["bound"] == pytest.approx([1e-4, 0.0, 0.0])
    assert r["collapsed"] == [True, False, None] and r["converged"] == [True, False, None]
    scaled = relative_lambda_min([{**x, **{k: x[k] * 1e6 for k in ("lambda_min", "lambda_max", "error_bound_min")
                                          if k in x}} for x in records])
    assert scaled["ratio"] == pytest.approx(r["ratio"]) and scaled["bound"] == pytest.approx(r["bound"])
    path = plot_lambda_over_training({"h": [{**x, "out_std": 0.01, "collapse_bound": 0.02} for x in records]},
                                     tmp_path / "l.png")
    assert path.is_file() and path.stat().st_size > 10_000
