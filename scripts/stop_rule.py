"""What ``stop_when_stable=tol`` would have saved and cost on fits that ran all their rounds.

Reads ``scripts/frontier.py run --defaults`` rows (each round's C2ST against the reference, its cumulative
seconds, and ``change``: the rule's statistic between that round and the previous one) and, for each tolerance,
finds where the rule would have stopped each fit (the first round whose change is below it) and prints a markdown
table: per tolerance, per fit, the stopping round, its seconds and C2ST beside the full fit's; then the mean
fraction of time saved and the mean and worst C2ST lost.

    .venv/bin/python scripts/stop_rule.py results/frontier_defaults.jsonl --tolerances 0.05 0.1 0.15 0.2
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from frontier import configuration, read_jsonl


def fits(paths: list[Path]) -> dict[tuple, list[dict]]:
    """Complete ``--defaults`` fits (their last row marked), by ``frontier.configuration``, rows by round."""
    rows = defaultdict(list)
    for r in read_jsonl(*paths):
        if r.get("schedule") == "defaults" and "change" in r:
            rows[configuration(r)].append(r)
    return {k: sorted(v, key=lambda r: r["round"]) for k, v in rows.items() if any(r["last"] for r in v)}


def stop(rows: list[dict], tolerance: float) -> dict:
    """The row the rule stops at: the first whose change is below ``tolerance``, else the last."""
    return next((r for r in rows if r["change"] is not None and r["change"] < tolerance), rows[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2])
    args = parser.parse_args()
    complete = fits(args.files)
    if not complete:
        raise SystemExit("no complete --defaults fit with the rule's statistic ('change') in these files")
    print("| tolerance | fit | stops after round | seconds (full fit) | C2ST at stop (full fit) |")
    print("|---|---|---|---|---|")
    summary = []
    for tolerance in args.tolerances:
        saved, lost = [], []
        for (task, epsilon, _, method, *_, seed), rows in sorted(complete.items()):
            at, last = stop(rows, tolerance), rows[-1]
            saved.append(1 - at["seconds"] / last["seconds"])
            lost.append(at["c2st"] - last["c2st"])
            print(
                f"| {tolerance:g} | {task} eps {epsilon:g} {method.upper()} seed {seed} | {at['round']} of {last['round']} "
                f"| {at['seconds']:.0f} ({last['seconds']:.0f}) | {at['c2st']:.3f} ({last['c2st']:.3f}) |"
            )
        summary.append(
            f"| {tolerance:g} | {len(saved)} | {100 * sum(saved) / len(saved):.0f} % "
            f"| {sum(lost) / len(lost):+.3f} | {max(lost):+.3f} |"
        )
    print("\n| tolerance | fits | time saved (mean) | C2ST change at stop (mean) | (worst) |")
    print("|---|---|---|---|---|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
