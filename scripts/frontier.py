"""Accuracy per second of compute: C2ST against the task's validated reference after every round, against
wall time and simulations, for SPPE (atomic APT or truncated-prior proposals) and SPLE over inner releases M
and plain MC vs RQMC.

    python scripts/frontier.py run --task regression --epsilon 1 --method sppe --configs 1:mc,8:rqmc \\
        --rounds 6 --sims-per-round 1000 --max-epochs 20 --seconds 600 --seeds 0 --out frontier.jsonl
    python scripts/frontier.py run --task sir --epsilon 1 --simulator exact --method sple --configs 8:rqmc \
        --training '{"max_steps": 500, "lr_schedule": "cosine", "lr": 1e-3}' --out frontier.jsonl
    python scripts/frontier.py run --task regression --epsilon 10 --method sppe --defaults --out frontier.jsonl
    python scripts/frontier.py report frontier.jsonl --figure docs/figures/frontier.png

``run`` appends one JSON line per round to ``--out`` as it goes (a killed run loses at most a round; a
configuration and seed already complete in the file is skipped), and gives each configuration the
library's budget of ``--seconds`` (a round expected to end past it is not started). ``--training`` (JSON) gives the training settings of
every configuration in place of ``--max-epochs`` (unnamed ones keep the library's defaults); ``--defaults``
runs the estimator exactly as ``SPPE(task)`` / ``SPLE(task)`` builds it (its default budget and training),
for as many rounds as the defaults have; ``--overrides`` (estimator arguments) and ``--reference`` (reference
settings), both JSON, and ``--draws`` shrink a run to a smoke test and join its schedule label. Wall time
counts simulation, training and the 2000 (``--draws``) draws the score needs (SPLE's MCMC included), not the
scoring itself; one torch thread. Each row also holds ``change``: the statistic of ``stop_when_stable``
between that round and the previous one (not timed), so that the rule's tolerance can be read off the same
fits, and ``sd`` / ``width95``: each parameter's posterior sd and central 95 % interval width from the scored
draws (scripts/privacy_utility.py reads them). Rows written before the budget existed stopped after the first
round that ended past ``--seconds``. ``report`` prints a markdown table (per configuration: the first time and
simulation count at which C2ST <= 0.55, the best C2ST, and its time) and draws C2ST against time and against
simulations.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time
from pathlib import Path

import torch

import dpsbi
from dpsbi.experiment.config import build_task
from dpsbi.experiment.reference import reference_posterior
from dpsbi.files import atomic_write_text

#: Reference settings: those of dpsbi/configs/config.yaml.
REFERENCE = dict(
    num_samples=2000,
    pilot_simulations=1000,
    max_simulations=20_000_000,
    importance_particles=5000,
    importance_draws=1_000_000,
)
TARGET = 0.55
#: Posterior mass cut by ``--method tsppe`` (SPPE with truncated-prior proposals, TSNPE's 1e-4).
TRUNCATE = 1e-4
DRAWS = 2000


def parse_configs(text: str) -> list[tuple[int, bool]]:
    """``"1:mc,8:rqmc"`` as ``[(1, False), (8, True)]``."""
    configs = []
    for item in text.split(","):
        m, kind = item.split(":")
        if kind not in ("mc", "rqmc"):
            raise SystemExit(f"configuration {item!r}: the kind must be mc or rqmc")
        configs.append((int(m), kind == "rqmc"))
    return configs


def schedule(row: dict) -> str:
    """A row's training schedule as a label: ``"defaults"``, the ``--training`` JSON, or ``"<= 20 epochs"``
    (rows written before step budgets existed)."""
    return row.get("schedule", f"<= {row.get('max_epochs', 20)} epochs")


def short(label: str) -> str:
    """A schedule label for tables: ``--training`` JSON as e.g. ``"500 steps, cosine, lr 0.001"``."""
    if not label.startswith("{"):
        return label
    training = json.loads(label)
    parts = [
        f"{training.pop('max_steps')} steps" if training.get("max_steps") else None,
        training.pop("lr_schedule", None),
        f"lr {training.pop('lr')}" if "lr" in training else None,
    ]
    parts += [f"{k} {v}" for k, v in training.items() if v is not None]
    return ", ".join(p for p in parts if p)


def configuration(row: dict) -> tuple:
    """The configuration a row belongs to: ``(task, epsilon, simulator, method, M, qmc, schedule, seed)``."""
    keys = ("task", "epsilon", "simulator", "method", "inner_samples", "qmc")
    return (*(row[k] for k in keys), schedule(row), row["seed"])


def read_jsonl(*paths: Path) -> list[dict]:
    """The rows of JSON-lines files, in order (blank lines skipped)."""
    return [
        json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()
    ]


def done(out: Path) -> set[tuple]:
    """The :func:`configuration` of every one the output file holds as complete (one file may hold several tasks
    and epsilons)."""
    if not out.is_file():
        return set()
    return {configuration(r) for r in read_jsonl(out) if r.get("last")}


def reference_cache() -> Path:
    """Where references are cached: ``$DPSBI_CACHE``, else ``~/.cache/dpsbi/references``, as
    dpsbi/configs/config.yaml does."""
    return Path(os.environ.get("DPSBI_CACHE") or Path("~/.cache/dpsbi/references").expanduser())


def reference_for(task, task_config: dict, settings: dict | None = None):
    """The task's validated reference posterior with :data:`REFERENCE`'s settings, ``settings`` over them
    (cached, :func:`reference_cache`)."""
    return reference_posterior(
        task,
        task_config,
        cache_dir=reference_cache(),
        seed=0,
        progress=False,
        **{**REFERENCE, **(settings or {})},
    )


#: ``--method`` names: the estimators a run (and :func:`amortized_fit`) builds.
ESTIMATORS = {
    "sppe": dpsbi.SPPE,
    "sple": dpsbi.SPLE,
    "tsppe": functools.partial(dpsbi.SPPE, truncate=TRUNCATE),
}


def amortized_fit(
    task,
    epsilon_range: tuple[float, float],
    args: argparse.Namespace,
    name: str,
    seed: int = 0,
    estimator: str = "sppe",
) -> tuple:
    """One epsilon-amortized fit of ``task`` by ``estimator`` (a name in :data:`ESTIMATORS`) and its times, for
    scripts that score such fits. With ``args.posteriors`` it checkpoints its rounds to ``<posteriors>/<key>/`` (a
    killed fit resumes there), is saved as ``<posteriors>/<key>.pt``, and one saved there before is loaded instead
    of trained (its times are ``{"loaded": path}``); ``key`` is ``name`` for SPPE (the files written before other
    estimators were taken) and ``<name>_<estimator>`` otherwise (``naive_bayes_sple``), so that one estimator's
    file is never loaded as another's. ``args.rounds`` (when set) and ``args.overrides`` are the estimator's
    arguments."""
    build = ESTIMATORS[estimator]
    key = name if estimator == "sppe" else f"{name}_{estimator}"
    saved = None if args.posteriors is None else args.posteriors / f"{key}.pt"
    if saved is not None and saved.is_file():
        posterior = dpsbi.load_posterior(saved, task=task)
        expected = getattr(build, "func", build).method  # tsppe's partial builds an SPPE
        if posterior.method != expected:
            raise SystemExit(f"{saved} holds a {posterior.method} fit, not the {expected} fit asked for")
        fitted = tuple(posterior.epsilon_range or ())
        if len(fitted) != 2 or not all(math.isclose(a, b) for a, b in zip(fitted, epsilon_range)):
            raise SystemExit(
                f"{saved} was fitted over epsilon {fitted}, not the {tuple(epsilon_range)} asked for"
            )
        return posterior, {"loaded": str(saved)}
    wall, cpu = time.perf_counter(), time.process_time()
    settings = {**({"rounds": args.rounds} if args.rounds else {}), **args.overrides}
    posterior = build(
        task,
        amortized=True,
        epsilon_range=epsilon_range,
        progress=False,
        seed=seed,
        checkpoint_dir=None if saved is None else args.posteriors / key,
        **settings,
    ).run()
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        posterior.save(saved)
    return posterior, {
        "fit_wall_s": round(time.perf_counter() - wall, 1),
        "fit_cpu_s": round(time.process_time() - cpu, 1),
    }


def label(args: argparse.Namespace) -> str:
    """This invocation's schedule label (see :func:`schedule`), ``--overrides``, ``--reference`` and ``--draws``
    appended when given (their rows are then no defaults' rows)."""
    if args.defaults:
        base = "defaults"
    else:
        base = json.dumps(args.training, sort_keys=True) if args.training else f"<= {args.max_epochs} epochs"
    shrunk = {key: value for key in ("overrides", "reference") if (value := getattr(args, key))}
    if args.draws != DRAWS:
        shrunk["draws"] = args.draws
    return f"{base} + {json.dumps(shrunk, sort_keys=True)}" if shrunk else base


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    task_config = {
        "name": args.task,
        "epsilon": args.epsilon,
        **({"simulator": args.simulator} if args.simulator else {}),
    }
    task = build_task(task_config)
    reference = reference_for(task, task_config, args.reference)
    print(f"reference: {reference.note}", flush=True)
    finished = done(args.out)
    estimator = ESTIMATORS[args.method]
    configs = (
        [{}]
        if args.defaults
        else [
            dict(
                rounds=args.rounds,
                sims_per_round=args.sims_per_round,
                inner_samples=m,
                qmc=qmc,
                training=args.training or {"max_epochs": args.max_epochs},
            )
            for m, qmc in parse_configs(args.configs)
        ]
    )
    for seed in args.seeds:
        for settings in configs:
            fitted = estimator(
                task,
                seed=seed,
                progress=False,
                budget=dict(seconds=args.seconds),
                **{**settings, **args.overrides},
            )
            key = (args.task, args.epsilon, args.simulator or "default", args.method)
            if (*key, fitted.inner_samples, fitted.qmc, label(args), seed) not in finished:
                fit_configuration(fitted, reference.samples, seed, args)


def spread(draws: torch.Tensor) -> dict:
    """Each parameter's posterior sd and central 95 % interval width, from ``draws (n, dim)``."""
    low, high = torch.quantile(draws.double(), torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
    return {
        "sd": [round(v, 5) for v in draws.double().std(0).tolist()],
        "width95": [round(v, 5) for v in (high - low).tolist()],
    }


def fit_configuration(fitted, reference: torch.Tensor, seed: int, args) -> None:
    """Fit the estimator ``fitted`` (built with a budget of ``args.seconds``: no round is started that is
    expected to end past it), appending a JSON line per round from its round callback; the configuration's
    last line is then marked ``"last"``."""
    sampling, summary = 0.0, None

    def on_round(index: int, posterior, num_simulations: int) -> None:
        nonlocal sampling, summary
        tic = time.perf_counter()
        draws = posterior.sample((args.draws,), seed=seed)
        sampling += time.perf_counter() - tic
        before, summary = (
            summary,
            fitted.stability_summary(posterior),
        )  # the stop rule's statistic (not timed)
        row = {
            "task": args.task,
            "epsilon": args.epsilon,
            "simulator": args.simulator or "default",
            "method": args.method,
            "inner_samples": fitted.inner_samples,
            "qmc": fitted.qmc,
            "schedule": label(args),
            "seed": seed,
            "round": len(fitted.history),  # rounds finished so far
            "num_simulations": num_simulations,
            "seconds": round(sum(entry["seconds"] for entry in fitted.history) + sampling, 2),
            "c2st": round(dpsbi.metrics.c2st(draws.cpu(), reference[: args.draws], seed=0), 4),
            "steps": fitted.history[-1]["steps"],
            "change": None if before is None else round(fitted.stability_change(before, summary), 4),
            **spread(draws.cpu()),
            "last": False,
        }
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    fitted.on_round_end = on_round
    fitted.run()
    lines = args.out.read_text().splitlines()  # this process appended the configuration's rows last
    lines[-1] = json.dumps({**json.loads(lines[-1]), "last": True})
    atomic_write_text(args.out, "\n".join(lines) + "\n")


def report(args: argparse.Namespace) -> None:
    rows = read_jsonl(*args.files)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(configuration(r), []).append(r)
    print(
        "| task | epsilon | method | M | kind | training | seed | first C2ST <= 0.55 (s / simulations) | best C2ST (at s, round) | rounds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["round"])
        hit = next((r for r in rs if r["c2st"] <= TARGET), None)
        best = min(rs, key=lambda r: r["c2st"])
        first = f"{hit['seconds']:.0f} s / {hit['num_simulations']}" if hit else "not reached"
        task, eps, sim, method, m, qmc, training, seed = key
        print(
            f"| {task}{'' if sim == 'default' else f' ({sim})'} | {eps:g} | {method.upper()} | {m} | {'RQMC' if qmc else 'MC'} | {short(training)} | {seed} | {first} | {best['c2st']:.3f} ({best['seconds']:.0f} s, {best['round']}) | {len(rs)} |"
        )
    if args.figure:
        plot(groups, args.figure)


def plot(groups: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(k[0], k[1], k[3]) for k in groups})
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for row, panel in enumerate(panels):
        for key, rs in sorted(groups.items()):
            if (key[0], key[1], key[3]) != panel:
                continue
            rs = sorted(rs, key=lambda r: r["round"])
            label = f"M={key[4]} {'RQMC' if key[5] else 'MC'}, {short(key[6])}, seed {key[7]}"
            for ax, x in zip(axes[row], ("seconds", "num_simulations")):
                ax.plot([r[x] for r in rs], [r["c2st"] for r in rs], marker="o", label=label)
        for ax, x in zip(axes[row], ("wall time (s, one core)", "simulations")):
            ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
            ax.set(
                xlabel=x,
                ylabel="C2ST vs reference",
                title=f"{panel[2].upper()}, {panel[0]}, epsilon {panel[1]:g}",
            )
        axes[row][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run")
    r.add_argument("--task", required=True)
    r.add_argument("--epsilon", type=float, required=True)
    r.add_argument("--simulator", help="task.simulator (sir: exact or tau_leap)")
    r.add_argument(
        "--method",
        choices=("sppe", "sple", "tsppe"),
        required=True,
        help="tsppe: SPPE with truncated-prior proposals (TSNPE)",
    )
    r.add_argument(
        "--configs", default="1:mc,4:rqmc,8:mc,8:rqmc,32:rqmc", help="M:kind list, kind mc or rqmc"
    )
    r.add_argument("--rounds", type=int, default=6)
    r.add_argument("--sims-per-round", type=int, default=1000)
    r.add_argument("--max-epochs", type=int, default=20)
    r.add_argument(
        "--seconds", type=float, default=600, help="each configuration's budget of fitting seconds"
    )
    r.add_argument(
        "--training",
        type=json.loads,
        help="JSON training settings for every configuration, e.g. '{\"max_steps\": 500}'",
    )
    r.add_argument(
        "--defaults",
        action="store_true",
        help="the estimator's own defaults (ignores --configs, --rounds, ...)",
    )
    r.add_argument(
        "--overrides",
        type=json.loads,
        default={},
        help="estimator arguments over every configuration, --defaults included, as JSON (a smoke test: "
        "'{\"rounds\": 1}'); they join the schedule label",
    )
    r.add_argument(
        "--reference",
        type=json.loads,
        default={},
        help="reference settings over dpsbi/configs/config.yaml's as JSON (a smoke test: "
        "'{\"importance_draws\": 20000}'); they join the schedule label",
    )
    r.add_argument(
        "--draws",
        type=int,
        default=DRAWS,
        help="posterior draws scored per round, against as many reference draws",
    )
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--out", type=Path, required=True)
    p = commands.add_parser("report")
    p.add_argument("files", nargs="+")
    p.add_argument("--figure", type=Path)
    args = parser.parse_args(argv)
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
