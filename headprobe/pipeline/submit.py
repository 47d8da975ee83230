"""`headprobe submit RECIPE`: the run as a SLURM job, through submitit (an optional dependency:
``pip install 'headprobe[slurm]'``), as dinov2's eval code submits itself.

The recipe is read and checked here, before anything is submitted (a bad one exits 2 with nothing queued), and the
job gets the resolved recipe, so editing the file afterwards changes nothing. The run directory is fixed at
submission, so a job that submitit requeues (preemption, or the time limit with ``--signal-delay``) resumes it:
`RunJob.checkpoint` resubmits the same run with ``resume=True``, and `headprobe run --resume` continues from the
finished stages and the last training checkpoint. Inside the job the thread count follows the CPUs SLURM gave it
(`parallel.threads`). ``--local`` runs the job on this machine with submitit's local executor (how it is tested).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["RunJob", "SubmitOptions", "submit"]


@dataclass
class SubmitOptions:
    """What the scheduler is asked for. time_min: the job's time limit in minutes; cpus: CPUs for the one task;
    gpus: GPUs on the node; mem_gb: memory (None: the partition's default); partition: the SLURM partition (None:
    the cluster's default); local: submitit's local executor instead of SLURM; logs: submitit's folder (job
    scripts, pickles, stdout and stderr per job)."""

    time_min: int = 60
    cpus: int = 8
    gpus: int = 0
    mem_gb: float | None = None
    partition: str | None = None
    local: bool = False
    logs: Path | None = None

    def check(self) -> None:
        for name, value in (("--time", self.time_min), ("--cpus", self.cpus)):
            if value < 1:
                raise ValueError(f"{name} = {value} is out of range; it must be >= 1.")
        if self.gpus < 0:
            raise ValueError(f"--gpus = {self.gpus} is out of range; it must be >= 0.")
        if self.mem_gb is not None and not 0 < self.mem_gb < float("inf"):
            raise ValueError(f"--mem-gb = {self.mem_gb:g} is out of range; it must be > 0 GB, or left out for the "
                             "partition's default.")
        if self.local and self.gpus > 0:
            import torch

            here = torch.cuda.device_count()
            if here < self.gpus:
                raise ValueError(f"--local --gpus {self.gpus} asks this machine for {self.gpus} GPU(s), but torch "
                                 f"sees {here} here; the job would run on fewer (or on the CPU) without saying so: "
                                 f"{f'pass --gpus {here} or less' if here else 'leave out --gpus'}, or submit to "
                                 "SLURM without --local.")


@dataclass
class RunJob:
    """The callable submitit pickles and runs on the node: `pipeline.run` of the resolved recipe into `out`.
    On requeue (`checkpoint`) it resumes the same run directory."""

    recipe: dict
    out: str
    resume: bool = False

    def __call__(self) -> str:
        from headprobe.pipeline.compose import run

        resume = self.resume and (Path(self.out) / "results.json").is_file()
        return str(run(self.recipe, out=self.out, resume=resume).path)

    def checkpoint(self, *args: Any, **kwargs: Any):
        """submitit calls this before requeueing the job: the same run again, resumed."""
        import submitit

        return submitit.helpers.DelayedSubmission(replace(self, resume=True))


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ValueError("`headprobe submit` needs submitit; install it with pip install 'headprobe[slurm]' (or "
                         "pip install submitit), or launch with sbatch and `headprobe run` yourself.") from None
    return submitit


def submit(recipe_path: str | Path, *, out: str | Path | None = None, overrides: list[str] | None = None,
           options: SubmitOptions | None = None):
    """Submit the recipe's run as one job; returns (submitit job, run directory). Raises ValueError with a sentence
    when submitit is missing or an option is out of range, `RecipeError` for a bad recipe (nothing submitted)."""
    from headprobe.record.directory import default_run_dir

    from ..recipe import load_recipe

    options = options or SubmitOptions()
    options.check()
    recipe = load_recipe(recipe_path, overrides)
    if recipe.sweep:
        raise ValueError("`headprobe submit` sends one run; submit each combination of the sweep by its --set "
                         "values, or run the sweep with `headprobe run` inside a job.")
    submitit = _submitit()
    if not options.local and shutil.which("sbatch") is None:
        raise ValueError("no SLURM here (sbatch is not on PATH); submit from the cluster's login node, or pass "
                         "--local to run the job on this machine.")
    run_dir = Path(out) if out is not None else default_run_dir(recipe.name)
    if (run_dir / "results.json").exists():
        raise ValueError(f"--out {run_dir} already holds a run; continue it with `headprobe run RECIPE --resume --out "
                         f"{run_dir}`, or choose another --out.")
    logs = options.logs or run_dir.parent / "submitit"
    executor = submitit.AutoExecutor(folder=str(logs), cluster="local" if options.local else "slurm")
    parameters: dict[str, Any] = {"name": f"headprobe-{recipe.name}", "timeout_min": options.time_min,
                                  "cpus_per_task": options.cpus, "gpus_per_node": options.gpus,
                                  "tasks_per_node": 1, "nodes": 1}
    if options.mem_gb is not None:
        parameters["mem_gb"] = options.mem_gb
    if options.partition is not None and not options.local:
        parameters["slurm_partition"] = options.partition
    executor.update_parameters(**parameters)
    job = executor.submit(RunJob(recipe.to_dict(), str(run_dir.resolve())))
    return job, run_dir
