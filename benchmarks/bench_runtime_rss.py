"""The resident memory a run holds before it has loaded a model or an image: the runtime term of `headprobe plan`.

A fresh interpreter imports what `headprobe run` imports (the pipeline, every built-in probe's module, scikit-learn's
estimators, the report and its matplotlib figures), runs one small torch matmul so its thread pools start, and prints
its resident set size (VmRSS) and peak (VmHWM). `headprobe plan` adds this to the weights and arrays it computes
(`headprobe/pipeline/plan.py`); tests/test_plan.py compares the total with a real run's peak.

    python benchmarks/bench_runtime_rss.py [--repeats N]
"""

from __future__ import annotations

import json
import subprocess
import sys

from _common import Report, mib, parse_args

CODE = """
import json
from pathlib import Path
import torch, transformers, sklearn.linear_model, sklearn.model_selection, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
import headprobe.pipeline.compose, headprobe.pipeline.stages, headprobe.report.html
from headprobe.probes.declaration import declared_probes
declared_probes()
torch.randn(64, 64) @ torch.randn(64, 64)
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
kib = lambda key: int(status[key].split()[0]) * 1024
print(json.dumps({"rss": kib("VmRSS"), "hwm": kib("VmHWM")}))
"""


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=3, quick_repeats=1)
    report = Report("runtime_rss", args, {"imports": "torch, transformers, sklearn, matplotlib, headprobe's pipeline, "
                                                     "report and built-in probes"})
    rss, hwm = [], []
    for _ in range(args.repeats):
        done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
        out = json.loads(done.stdout.strip().splitlines()[-1])
        rss.append(out["rss"])
        hwm.append(out["hwm"])
    rss.sort()
    hwm.sort()
    report.extra["measured"] = {"rss_after_imports_bytes": rss[len(rss) // 2], "hwm_after_imports_bytes":
                                hwm[len(hwm) // 2], "all_rss_bytes": rss}
    print(f"   resident after imports: median {mib(rss[len(rss) // 2])} MiB (peak {mib(hwm[len(hwm) // 2])} MiB)")
    report.note("The runtime term of headprobe plan's peak-memory estimate: the median VmRSS of a fresh process "
                "after the imports of a run, before any model or image.")
    report.finish()


if __name__ == "__main__":
    main()
