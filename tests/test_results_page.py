"""docs/RESULTS.md stays runnable: every command in its ``sh`` blocks names a script or entry point that exists, the
results files it reads exist, every figure it shows exists, the commands that only read committed results
(reports) run and reproduce the page's tables from them, and every other command (the measurements) runs at a
tiny budget (:data:`TINY`), so that a renamed flag, a removed option or a broken script fails here."""

import glob
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import prewarmed
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "RESULTS.md"
ENVIRONMENT_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


def blocks() -> list[list[list[str]]]:
    """The page's ``sh`` blocks, each a list of commands as argument lists (the leading environment
    assignments and ``.venv/bin/`` dropped; Hydra overrides such as ``experiment=...`` kept)."""
    out = []
    for block in PAGE.read_text().split("```sh\n")[1:]:
        found = []
        for line in block.split("```")[0].splitlines():
            words = shlex.split(line)
            while words and ENVIRONMENT_ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words:
                found.append([w.removeprefix(".venv/bin/") for w in words])
        out.append(found)
    return out


def commands() -> list[list[str]]:
    """The page's commands, every block's in order."""
    return [words for block in blocks() for words in block]


def program(words: list[str]) -> str:
    """What a command runs: its script (``python X``, ``bash X`` or ``X`` itself) or its entry point."""
    return words[1] if words[0] in ("python", "bash") else words[0]


def is_report(words: list[str]) -> bool:
    """Whether a command only reads results."""
    return words[:2] == ["python", "scripts/stop_rule.py"] or "report" in words


def recipe_key(words: list[str]) -> str:
    """A command's key in :data:`TINY`: its program, then its subcommand (the next word, when a bare name
    such as ``run``) and its Hydra ``experiment=`` override, where it has them."""
    rest = words[words.index(program(words)) + 1 :]
    chosen = rest[:1] if rest and rest[0].isidentifier() else []
    return " ".join([program(words), *chosen, *(w for w in rest if w.startswith("experiment="))])


@dataclass(frozen=True)
class Tiny:
    """How a measurement command is shrunk. ``args`` (shell words) replace the page's arguments of the same
    name (an option with its values, a Hydra override by its key) and are appended where the page has none;
    ``env`` joins the environment. The command runs in a temporary directory, where relative paths land:
    ``output`` is a path (a glob pattern) it must leave there, ``printed`` a string its standard output must hold. ``skip``:
    why it cannot run here."""

    args: str = ""
    env: dict = field(default_factory=dict)
    output: str | None = None
    printed: str = ""
    skip: str = ""


#: Estimator arguments and reference settings (scripts/frontier.py's ``--reference``) that take seconds.
FIT = shlex.quote(
    json.dumps(
        dict(rounds=1, sims_per_round=50, training=dict(max_steps=5), flow=dict(transforms=1, blocks=1))
    )
)
REFERENCE = shlex.quote(json.dumps({"importance_particles": 500, "importance_draws": 20_000}))
#: dpsbi-run budgets of a few seconds a run, no figures (SPLE's MCMC cut too: its 500 chains dominate a tiny
#: run; ``++`` sets a method's settings whether or not the experiment names the method).
SWEEP = (
    "budget.rounds=1 budget.sims_per_round=20 budget.inner_samples=2 budget.max_epochs=1 budget.max_steps=2 "
    "evaluation.num_samples=50 evaluation.lmd_draws=50 plots=false "
    "++method_settings.sple.mcmc.num_chains=20 ++method_settings.sple.mcmc.warmup=2"
)
#: Every measurement command of the page, by :func:`recipe_key`: how it runs here in seconds.
TINY = {
    "scripts/frontier.py run": Tiny(
        f"--overrides {FIT} --reference {REFERENCE} --draws 200 --out frontier.jsonl", output="frontier.jsonl"
    ),
    "scripts/amortized_check.py": Tiny(
        f"--tasks conjugate_gaussian --epsilons 0.7 --seed 0 --releases 1 --pairs 10 --draws 200 --overrides {FIT} "
        "--importance 2000 --importance-calibration 200 --task-options {} --out amortized_check.jsonl",
        output="amortized_check.jsonl",
    ),
    "scripts/amortized_diagnosis.py run": Tiny(
        f"--variants both --seeds 0 --epsilons 1 --overrides {FIT} --reference {REFERENCE} --draws 200 "
        "--out amortized_diagnosis.jsonl",
        output="amortized_diagnosis.jsonl",
    ),
    "scripts/amortized_probes.py run": Tiny(
        f"--seeds 0 --epsilons 1 --overrides {FIT} --reference {REFERENCE} --draws 200 --out probes.jsonl",
        output="probes.jsonl",
    ),
    "scripts/amortized_epsilon.py": Tiny(f"{FIT} --draws 200 --releases 1", printed='"c2st"'),
    "scripts/privacy_utility.py run": Tiny(
        f"--releases 2 --draws 200 --overrides {FIT} --reference {REFERENCE} --importance 40 "
        "--out privacy_utility.jsonl",
        output="privacy_utility.jsonl",
    ),
    "scripts/real_release_check.py": Tiny(
        f"--draws 200 --overrides {FIT} --out real_release_check.jsonl", output="real_release_check.jsonl"
    ),
    "scripts/fit_eta.py": Tiny("--rounds 2 --steps 5 --out fit_eta.jsonl", output="fit_eta.jsonl"),
    "scripts/composed_check.py": Tiny(
        f"--draws 200 --reference-draws 2000 --overrides {FIT} --out composed_check.jsonl",
        output="composed_check.jsonl",
    ),
    "scripts/census_scale.py run": Tiny(
        f"--cells 10 --reference-draws 500 --draws 200 --overrides {FIT} "
        "--work census --out census_scale.jsonl",
        output="census_scale.jsonl",
    ),
    # 1000 tau-leaping particles: with 300 or 600 the SMC pilot degenerates and the 600 draws' ESS (1-9, either
    # step of tau-leaping) falls either side of the 4 that smoothed resampling needs, by chance; 1000: ESS 43
    "scripts/sir_references.py": Tiny(
        "--draws 600 --refit-draws 50 --chunk 50 --tau-particles 1000 --tau-draws 400 --store 20 "
        "--work sir_references --store-dir references",
        output="references/sir_eps1.csv",
    ),
    "dpsbi-run experiment=sir_outbreaks": Tiny(
        f"task=sir_ebola_guinea method=sppe {SWEEP}", output="multirun/outbreaks*/comparison.csv"
    ),
    "dpsbi-run experiment=sir_outbreaks_private": Tiny(
        f"task=sir_ebola_guinea method=sppe {SWEEP}", output="multirun/outbreaks_private/comparison.csv"
    ),
    "scripts/outbreaks.py report": Tiny("-o figures/outbreaks", output="figures/outbreaks_r0.png"),
    "scripts/outbreaks.py deterministic": Tiny(
        "--outbreaks sir_ebola_guinea --fractions 'K = 1e5 (paper)'", printed="| Ebola, Guinea | 1.71 | 1.53"
    ),
    "scripts/results_grid.sh": Tiny(
        f"task.epsilon=1 {SWEEP} reference.importance_particles=500 reference.importance_draws=20000 "
        "++method_settings.da_mcmc.num_iterations=50 ++method_settings.da_mcmc.num_chains=4",
        env={"SEEDS": "0", "TASKS": "regression"},
        output="multirun/grid/regression_seed0/comparison.csv",
    ),
    "scripts/main_grid.py collect": Tiny("--out main_grid.jsonl", output="main_grid.jsonl"),
    "scripts/fault_injection.py": Tiny(
        "--quick --only checkpoint posterior --work faults --out faults.json", output="faults.json"
    ),
    "scripts/bench_sple_sampling.py": Tiny(
        "--quick --posterior bench/sple.pt --repeats 1 --samples 100", printed="elliptical_slice"
    ),
    "scripts/rqmc_loss_variance.py": Tiny(
        "--out rqmc --pairs 2 --repeats 3 --max-m 4 --sims 50", output="rqmc/rqmc_loss_variance.json"
    ),
    "scripts/bench.py": Tiny("--quick --tasks regression --json bench.json", output="bench.json"),
    "scripts/cuda_check.sh": Tiny(skip="needs a machine with an NVIDIA GPU"),
    "scripts/bench_step.py": Tiny(
        "--devices cpu --sizes 100 --repeats 1 --warmup 0 --json bench_step_modes.jsonl",
        output="bench_step_modes.jsonl",
    ),
}
#: Reports of committed results (a report with a recipe reads what its block ran first: a measurement here).
REPORTS = [words for words in commands() if is_report(words) and recipe_key(words) not in TINY]


def cases() -> list[list[list[str]]]:
    """The page's measurements as test cases: each block's runnable ones together, in order, and each one that
    cannot run alone. A block's last commands are left out where each shrinks to one that an earlier case runs
    (a fit the page repeats in several blocks); a command before a new one stays, since the new one may read
    what it leaves."""
    out, ran = [], set()
    for block in blocks():
        measured = [words for words in block if not is_report(words) or recipe_key(words) in TINY]
        runnable = [words for words in measured if not TINY.get(recipe_key(words), Tiny()).skip]
        last = max((i for i, words in enumerate(runnable) if shrunk(words) not in ran), default=-1)
        kept = runnable[: last + 1]  # what a new command may read is left before it
        ran.update(shrunk(words) for words in kept)
        out += ([kept] if kept else []) + [[words] for words in measured if words not in runnable]
    return out


def shrunk(words: list[str]) -> tuple[tuple[str, ...], ...]:
    """The command that runs here for the page's ``words`` (:func:`shrink` by its recipe; a command without one
    is left as it is, for :func:`test_every_measurement_command_has_a_tiny_recipe` to name), as a key: its
    leading words in order, then its options and overrides sorted, since argparse and Hydra read them in any
    order (the page writes one command in several orders)."""
    found = groups(shrink(words, TINY.get(recipe_key(words), Tiny())))
    lead = next(
        (i for i, group in enumerate(found) if group[0].startswith("-") or "=" in group[0]), len(found)
    )
    return (*map(tuple, found[:lead]), *sorted(map(tuple, found[lead:])))


BIN = Path(sys.executable).parent


def test_every_command_names_a_script_or_entry_point_that_exists():
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    entry_points = set(re.findall(r"^([\w-]+) = ", scripts, re.M))
    assert entry_points >= {"dpsbi-run", "dpsbi-sample"}
    found = commands()
    assert len(found) >= 15
    for words in found:
        if "/" in program(words):
            assert (ROOT / program(words)).is_file(), words
        else:
            assert program(words) in entry_points, words


def test_the_results_files_read_and_the_figures_shown_exist():
    for words in commands():
        for word in words:
            if word.startswith("results/") and word.endswith(".jsonl"):
                assert glob.glob(str(ROOT / word)), word
    for figure in re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", PAGE.read_text()):
        assert (ROOT / "docs" / figure).is_file(), figure


@pytest.mark.parametrize("words", REPORTS, ids=[" ".join(w[1:3]) for w in REPORTS])
def test_the_report_commands_run_on_the_committed_results(words, tmp_path):
    """Reports read committed rows (``results/``); figures go to a temporary directory. Reports whose inputs are
    kept out of git (a census run's references) are skipped where absent."""
    if "census_scale.py" in words[1]:
        pytest.skip("census_scale's report reads its working files, kept out of git")
    args = []
    for i, word in enumerate(words[1:]):
        if words[i] == "--figure":
            args.append(str(tmp_path / "figure.png"))
        elif "*" in word:
            args.extend(sorted(glob.glob(word, root_dir=ROOT)))
        else:
            args.append(word)
    run = prewarmed.run([sys.executable, *args], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "|" in run.stdout and ("--figure" not in words or (tmp_path / "figure.png").is_file()), run.stdout[
        -500:
    ]


def groups(words: list[str]) -> list[list[str]]:
    """``words`` grouped: an option with its values; a Hydra override, or a positional word, alone."""
    out: list[list[str]] = []
    for word in words:
        if word.startswith("-") or "=" in word or not out or not out[-1][0].startswith("-"):
            out.append([word])
        else:
            out[-1].append(word)
    return out


def name(group: list[str]) -> str:
    """What a group sets: its option, its Hydra key (``key=``, any ``+`` dropped), or the positional word."""
    word = group[0]
    return word if word.startswith("-") or "=" not in word else word.split("=")[0].lstrip("+") + "="


def shrink(words: list[str], tiny: Tiny) -> list[str]:
    """The page's command, the recipe's arguments in place of those of the same name, the rest appended."""
    replacements = {name(group): group for group in groups(shlex.split(tiny.args))}
    kept = [replacements.pop(name(group), group) for group in groups(words)]
    return [word for group in kept + list(replacements.values()) for word in group]


def argv(words: list[str]) -> list[str]:
    """The command line running ``words`` here: this Python for scripts and entry points, bash for ``.sh``."""
    script, rest = program(words), words[words.index(program(words)) + 1 :]
    if script.endswith(".sh"):
        return ["bash", str(ROOT / script), *rest]
    return [sys.executable, str(ROOT / script), *rest] if "/" in script else [str(BIN / script), *rest]


def environment(work: Path, tiny: Tiny) -> dict:
    """One thread everywhere; reference caches in ``work``; this dpsbi-run (scripts/results_grid.sh's)."""
    threads = {key: "1" for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")}
    return {
        **os.environ,
        **threads,
        "DPSBI_CACHE": str(work / "cache"),
        "DPSBI_CONFIG_DIR": str(ROOT / "dpsbi" / "configs"),
        "DPSBI_RUN": str(BIN / "dpsbi-run"),
        "MPLBACKEND": "Agg",
        **tiny.env,
    }


def test_every_measurement_command_has_a_tiny_recipe():
    missing = {recipe_key(words) for words in commands() if not is_report(words)} - set(TINY)
    assert not missing, f"docs/RESULTS.md runs these without a TINY recipe here: {sorted(missing)}"


def test_a_command_shrinks_to_one_key_in_any_order_of_its_options_but_not_of_its_positional_words():
    page = shlex.split("python scripts/frontier.py run --task sir --epsilon 1 --seeds 0 1")
    assert shrunk(page) == shrunk(
        shlex.split("python scripts/frontier.py run --seeds 0 1 --epsilon 1 --task sir")
    )
    assert shrunk(page) != shrunk(
        shlex.split("python scripts/frontier.py run --task sir --epsilon 10 --seeds 0 1")
    )
    assert shrunk(page) != shrunk(
        shlex.split("python scripts/frontier.py run --task sir --epsilon 1 --seeds 1 0")
    )
    collect = shlex.split("python scripts/main_grid.py collect multirun/a multirun/b --out rows.jsonl")
    assert shrunk(collect) != shrunk([*collect[:3], "multirun/b", "multirun/a", *collect[5:]])


MEASURED = cases()


@pytest.mark.parametrize(
    "block", MEASURED, ids=[" + ".join(recipe_key(w).removeprefix("scripts/") for w in b) for b in MEASURED]
)
def test_the_measurement_commands_run_at_a_tiny_budget(block, tmp_path):
    """A block's measurements in order, in one temporary working directory (a later command may read an
    earlier one's output: ``scripts/outbreaks.py report`` the sweep before it). Commands that shrink to one
    already run (seeds and variants of one fit, or its options in another order: :func:`shrunk`) run once."""
    ran = set()
    for words in block:
        tiny = TINY[recipe_key(words)]
        if tiny.skip:  # alone in its case
            pytest.skip(tiny.skip)
        key = shrunk(words)
        if key in ran:
            continue
        ran.add(key)
        command = argv(shrink(words, tiny))
        run = prewarmed.run(command, cwd=tmp_path, env=environment(tmp_path, tiny), timeout=300)
        assert run.returncode == 0, f"{shlex.join(command)}\n{run.stderr[-3000:]}"
        assert tiny.output is None or glob.glob(str(tmp_path / tiny.output)), (
            tiny.output,
            run.stdout[-2000:],
        )
        assert tiny.printed in run.stdout, run.stdout[-2000:]
