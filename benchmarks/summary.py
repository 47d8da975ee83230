"""The performance table of benchmarks/README.md, from the JSON files the benchmark scripts wrote.

    python benchmarks/summary.py [--quick]   # Markdown on stdout
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ORDER = ("cache", "multihead", "knn", "linear", "augment_r2", "hessian", "extract", "intervals", "memmap",
         "sharded_probes", "sharded_probes_quickstart", "gpu")


def load(quick: bool, folder: Path = RESULTS) -> list[dict]:
    suffix = ".quick.json" if quick else ".json"
    found = {p.name.removesuffix(suffix): p for p in folder.glob(f"*{suffix}")
             if quick or not p.name.endswith(".quick.json")}
    if not found:
        raise SystemExit(f"no {suffix} results in {folder}; run `make bench` (or a script) first.")
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    return [json.loads(found[n].read_text()) for n in names]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(results: list[dict]) -> str:
    lines = ["| benchmark | compared with | target | measured | met? |", "|---|---|---|---|---|"]
    for result in results:
        for c in result["checks"]:
            lines.append("| " + " | ".join(_cell(c[k]) for k in ("benchmark", "compared_with", "target", "measured"))
                         + f" | {'yes' if c['met'] else '**no**'} |")
    m = results[0]["machine"]
    loads = [x for r in results for x in (r["machine"]["load_average_start"][0], r["machine"]["load_average_end"][0])]
    threads = sorted({r["machine"]["torch_threads"] for r in results})
    device = m["gpu"] or m["device"]
    lines += [
        "",
        f"Machine: {m['cpu']}, {m['cpus_available']} CPUs ({', '.join(map(str, threads))} torch thread(s)), "
        f"{m['memory_gib']} GiB, device {device}; Python {m['python']}, torch {m['torch']}, "
        f"scikit-learn {m['sklearn']}, numpy {m['numpy']}; {m['platform']}. "
        f"1-minute load average during the runs: {min(loads):.1f}-{max(loads):.1f} (shared machine).",
        "",
        "Commands: " + "; ".join(f"`{r['command']}` ({r['wall_s']:.0f} s, {r['finished'][:10]})" for r in results),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="summarise the --quick results instead")
    args = parser.parse_args()
    print(markdown(load(args.quick)))


if __name__ == "__main__":
    main()
