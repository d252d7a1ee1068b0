"""Time to accuracy: AdaptiveBatchSize against a sweep of static batch sizes (the paper's
headline shape). Goal: adaptive reaches the target at least 1.3x sooner in wall time than
the best static batch size, with final accuracy no worse than the smallest batch's.

Runs in: a driver process; every run is a real 2-rank job (gloo/CPU) of adaptive_train.py
with the same model, data, seeds and lr, launched one after another (``--rounds`` repeats
the sweep with the order reversed, and the medians are reported). Time is the job's own
training wall time (evaluations excluded) at the first evaluation at or above the target.
It prints the table and the ratios and writes an SVG plot of accuracy against time.

Usage: .venv/bin/python benchmarks/adaptive_batch.py [--target-acc 0.75] [--rounds 1]
       [--batches 32,64,128,256,512] [--plot docs/adaptive_batch.svg]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _common import job_env, machine_facts, median, private_home

import hpinteract as hpi

JOB = Path(__file__).resolve().parent / "adaptive_train.py"
GOAL = 1.3
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def run_one(label: str, args: list[str], home: Path) -> dict[str, Any]:
    job = hpi.launch(JOB, nproc=2, args=args, env=job_env(), home=home)
    if job.wait(1200).value != "finished":
        sys.exit(f"{label}: job {job.id} {job.state.value}: {job.error}\n{job.logs()[-3000:]}")
    ev = job.evals()
    curve = list(zip(ev["train_time"].tolist(), ev["val_acc"].tolist(), strict=True))
    batches = job.metrics()["batch_size"].tolist()
    return {"label": label, "curve": curve, "batches": sorted(set(batches)),
            "final": sum(a for _, a in curve[-3:]) / len(curve[-3:]),
            "seconds": curve[-1][0]}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, acc in curve if acc >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-acc", type=float, default=0.75)
    ap.add_argument("--batches", default="32,64,128,256,512", help="static global batches")
    ap.add_argument("--max-batch", type=int, default=1024)
    ap.add_argument("--start", type=int, default=None,
                    help="adaptive's first batch (default: the smallest static one)")
    ap.add_argument("--target", type=float, default=0.1, help="AdaptiveBatchSize(target=...)")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the 262,144 samples")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--plot", type=Path, default=Path("benchmarks/out/adaptive_batch.svg"))
    a = ap.parse_args()
    statics = [int(b) for b in a.batches.split(",")]
    if len(statics) < 4:
        ap.error("sweep at least four static batch sizes")
    home = private_home()
    print(machine_facts())
    print(f"adaptive batch: 2 ranks, gloo/CPU, teacher-student classification (262,144 "
          f"fresh samples, one pass), the same lr 0.05 (momentum 0.9) in every run; "
          f"target validation accuracy {a.target_acc}\n", flush=True)
    runs = [(f"static {b}", ["--batch", str(b), "--epochs", str(a.epochs)]) for b in statics]
    start = a.start or statics[0]
    runs.append((f"adaptive {start}..{a.max_batch}",
                 ["--batch", str(start), "--adaptive", "--max-batch", str(a.max_batch),
                  "--target", str(a.target), "--epochs", str(a.epochs)]))
    report(a, statics, runs, run_rounds(runs, a.rounds, a.target_acc, home))


Runs = list[tuple[str, list[str]]]
Results = dict[str, list[dict[str, Any]]]


def run_rounds(runs: Runs, rounds: int, target: float, home: Path) -> Results:
    """Every run once a round, the order reversed every other round; each printed."""
    results: Results = {label: [] for label, _ in runs}
    for r in range(rounds):
        for label, args in runs if r % 2 == 0 else runs[::-1]:
            res = run_one(label, args, home)
            results[label].append(res)
            tt = time_to(res["curve"], target)
            print(f"round {r}  {label:<18} to target "
                  f"{f'{tt:.1f} s' if tt is not None else 'not reached':>12}  final acc "
                  f"{res['final']:.4f}  ({res['seconds']:.1f} s of training)", flush=True)
    return results


def median_time(results: Results, label: str, target: float) -> float | None:
    """The median over rounds of the time to ``target``; None if a round missed it."""
    times = [time_to(x["curve"], target) for x in results[label]]
    return median([t for t in times if t is not None]) if None not in times else None


def report(a: argparse.Namespace, statics: list[int], runs: Runs, results: Results) -> None:
    def med_time(label: str) -> float | None:
        return median_time(results, label, a.target_acc)

    print(f"\n{'run':<20}{'time to ' + str(a.target_acc):>16}{'final acc':>11}"
          f"{'training s':>12}{'batches used':>24}   (medians over rounds)")
    for label, _ in runs:
        t = med_time(label)
        rs = results[label]
        used = ",".join(str(int(b)) for b in rs[0]["batches"])
        print(f"{label:<20}{(f'{t:.1f} s' if t is not None else 'not reached'):>16}"
              f"{median([x['final'] for x in rs]):>11.4f}"
              f"{median([x['seconds'] for x in rs]):>12.1f}{used:>24}")
    adaptive = runs[-1][0]
    t_ad = med_time(adaptive)
    reached = {label: t for label, _ in runs[:-1] if (t := med_time(label)) is not None}
    final_small = median([x["final"] for x in results[runs[0][0]]])
    final_ad = median([x["final"] for x in results[adaptive]])
    print()
    if not reached:
        print("no static batch size reached the target: lower --target-acc")
    elif t_ad is None:
        print("adaptive did not reach the target: goal NOT met")
    else:
        best = min(reached, key=lambda k: reached[k])
        for label, t in reached.items():
            print(f"speed-up of adaptive over {label:<12} {t / t_ad:6.2f}x")
        ratio = reached[best] / t_ad
        ok = ratio >= GOAL and final_ad >= final_small - 0.005
        print(f"\nbest static: {best} ({reached[best]:.1f} s); adaptive {t_ad:.1f} s: "
              f"{ratio:.2f}x (goal >= {GOAL}x); final accuracy adaptive {final_ad:.4f} vs "
              f"smallest batch {final_small:.4f} (no worse within one evaluation's noise, "
              f"0.005) -> goal {'met' if ok else 'NOT met'}")
    write_svg(a.plot, a.target_acc, [(label, results[label][0]["curve"]) for label, _ in runs])
    print(f"plot: {a.plot}")


def write_svg(path: Path, target: float, curves: list[tuple[str, list[tuple[float, float]]]]
              ) -> None:
    """Accuracy against training time, one line per run (plain SVG: no plotting library)."""
    w, h, left, bottom = 640, 400, 60, 40
    t_max = max(t for _, c in curves for t, _ in c)
    accs = [acc for _, c in curves for _, acc in c]
    lo, hi = min(accs) - 0.005, max(accs) + 0.005

    def xy(t: float, acc: float) -> str:
        return (f"{left + (w - left - 20) * t / t_max:.1f},"
                f"{h - bottom - (h - bottom - 20) * (acc - lo) / (hi - lo):.1f}")

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             'font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<line x1="{left}" y1="{h - bottom}" x2="{w - 20}" y2="{h - bottom}" '
             'stroke="black"/>',
             f'<line x1="{left}" y1="20" x2="{left}" y2="{h - bottom}" stroke="black"/>',
             f'<text x="{w // 2}" y="{h - 8}" text-anchor="middle">training time (s)</text>',
             f'<text x="14" y="{h // 2}" transform="rotate(-90 14 {h // 2})" '
             'text-anchor="middle">validation accuracy</text>']
    ty = xy(0, target).split(",")[1]
    parts.append(f'<line x1="{left}" y1="{ty}" x2="{w - 20}" y2="{ty}" stroke="grey" '
                 f'stroke-dasharray="4 4"/><text x="{w - 24}" y="{float(ty) - 4}" '
                 f'text-anchor="end" fill="grey">target {target}</text>')
    for k in range(5):
        t = t_max * k / 4
        x = xy(t, lo).split(",")[0]
        parts.append(f'<text x="{x}" y="{h - bottom + 16}" text-anchor="middle">{t:.0f}</text>')
        acc = lo + (hi - lo) * k / 4
        y = xy(0, acc).split(",")[1]
        parts.append(f'<text x="{left - 6}" y="{y}" text-anchor="end">{acc:.3f}</text>')
    for i, (label, curve) in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        width = 3 if label.startswith("adaptive") else 1.5
        points = " ".join(xy(t, acc) for t, acc in curve)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width}" '
                     f'points="{points}"/>')
        parts.append(f'<text x="{w - 130}" y="{h - bottom - 20 - 16 * i}" fill="{colour}">'
                     f'{label}</text>')
    parts.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
