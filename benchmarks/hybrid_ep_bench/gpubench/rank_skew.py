"""How far apart the ranks sharing a GPU run the same kernel: start and end skew, each rank's
time, and the span from the first start to the last end, from the kernel lists that
``hybrid-ep bench --device cuda --kernel-traces`` writes per rank.

    python3 -m hybrid_ep_bench.gpubench.rank_skew OUT_DIR [--regime hbm] [--out OUT.md]

A dispatch or combine kernel waits for its peers, so a rank that starts early spends the
difference waiting: its kernel time holds the skew. The n-th launch of a kernel is the same call
on every rank (all ranks run the same sequence); launches are matched from the end, because the
profiler may miss a few at its start. Timestamps are the profiler's (CUPTI's GPU times mapped
to each process's clock), so ends that agree across ranks say the clocks agree too.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics

from .ranks import launches_by_op


def short_name(name: str) -> str:
    """The kernel's function name without namespaces and arguments."""
    match = re.search(r"(\w+)\s*(?:<[^()]*>)?\s*\(", name)
    return match.group(1) if match else name


def load_ranks(out_dir: str, regime: str) -> tuple[dict[int, list[dict]], dict[str, list[str]]]:
    """Each rank's kernels, and the ops a step's launches of a kernel belong to, in order."""
    ranks, ops = {}, {}
    for path in glob.glob(os.path.join(out_dir, f"kernels-{regime}-*r-rank*.json")):
        with open(path) as f:
            data = json.load(f)
        ranks[data["rank"]] = data["kernels"]
        ops = data.get("ops_per_step", ops)
    if not ranks:
        raise SystemExit(f"no kernels-{regime}-*r-rank*.json in {out_dir}")
    return dict(sorted(ranks.items())), ops


def _medians(launches_per_rank: list[list[dict]]) -> dict:
    """Medians over launches (the i-th from the end on every rank) of the start and end skew
    across ranks, the mean rank's time, and the spans to the last end."""
    starts, ends, means, spans, late = [], [], [], [], []
    for launches in zip(*launches_per_rank):
        s = [k["start_us"] for k in launches]
        e = [k["start_us"] + k["dur_us"] for k in launches]
        starts.append(max(s) - min(s))
        ends.append(max(e) - min(e))
        means.append(statistics.fmean(k["dur_us"] for k in launches))
        spans.append(max(e) - min(s))
        late.append(max(e) - max(s))  # from the last rank's start to the last end
    return {"launches": len(starts), "start_skew_us": statistics.median(starts),
            "end_skew_us": statistics.median(ends), "rank_time_us": statistics.median(means),
            "span_us": statistics.median(spans), "after_last_start_us": statistics.median(late)}


def skew_rows(ranks: dict[int, list[dict]], ops: dict[str, list[str]] | None = None) -> list[dict]:
    """One row per kernel of ours, or per op for a kernel that several ops of a step launch
    (``ops``: kernel -> the step's ops in launch order)."""
    ops = ops or {}
    by_name = []  # per rank: our kernels grouped by short name, in launch order
    for ks in ranks.values():
        groups: dict[str, list[dict]] = {}
        for k in ks:
            if "hybrid_ep" in k["name"]:
                groups.setdefault(short_name(k["name"]), []).append(k)
        by_name.append(groups)
    rows = []
    for name in sorted({n for groups in by_name for n in groups}):
        per_rank = [groups.get(name, []) for groups in by_name]
        step_ops = ops.get(name) or [name]
        split = [launches_by_op(p, step_ops) for p in per_rank]
        for op in step_ops:
            picked = [s[op] for s in split]
            n = min(len(p) for p in picked)
            if n:  # the n-th launch from the end is the same call on every rank
                rows.append({"kernel": name if op == name else f"{name} ({op})",
                             **_medians([p[len(p) - n:] for p in picked])})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--regime", default="hbm")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args()
    ranks, ops = load_ranks(args.out_dir, args.regime)
    lines = [f"{len(ranks)} ranks, regime {args.regime}, medians over launches (us)", "",
             ("| kernel | launches | start skew | end skew | mean rank's time | first start to "
              "last end | last start to last end |"), "|---|---|---|---|---|---|---|"]
    for r in skew_rows(ranks, ops):
        lines.append(f"| {r['kernel']} | {r['launches']} | {r['start_skew_us']:.1f} | "
                     f"{r['end_skew_us']:.1f} | {r['rank_time_us']:.1f} | {r['span_us']:.1f} | "
                     f"{r['after_last_start_us']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
