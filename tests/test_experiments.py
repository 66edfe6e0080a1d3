"""The experiment layer: every task x method config composes and either runs on a tiny CPU budget or is refused
with a clear error; outputs, reference cache, bad config values; dpsbi-run / dpsbi-sample / dpsbi-compare
end to end."""

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import scipy.stats
import torch
from hydra import compose, initialize_config_dir

import dpsbi
from dpsbi import cli
from dpsbi.experiment import METHODS, ConfigError, config_dir, plan, reference_posterior, run_experiment
from dpsbi.experiment.outputs import read_draws, read_rows
from dpsbi.mechanisms import Laplace

TASKS = [
    t for t in dpsbi.tasks.names() if t != "custom"
]  # "custom" imports a user's factory: tests/test_your_model.py
OUTBREAKS = [t for t in TASKS if t.startswith("sir_")]
RELEASED = [t for t in TASKS if t not in OUTBREAKS]  # tasks whose y_obs came from the mechanism
#: Where each method runs with its default config: the rest are refused with a clear error.
SUPPORT = {
    "sppe": TASKS,
    "sple": TASKS,
    "naive_npe": TASKS,
    "smc_abc": TASKS,
    "rejection_abc": RELEASED,
    "abc_is": RELEASED,
    "pmmh": RELEASED,
    "abcdp": ["regression", "uniform_mixture"],  # needs the confidential summary s_obs
    "da_mcmc": ["naive_bayes", "regression"],  # needs the record likelihood
    "mhaar": ["binary_responses", "normal_variance"],  # needs a latent summary / record model
    "mcem": ["poisson_counts"],  # needs a complete-data exponential family
    "mh_clt": [],  # needs a Gaussian CLT law and a Gaussian mechanism: normal_variance with task.noise=gaussian
}
#: Small budgets and quiet output for every run of these tests.
QUICK = [
    "companions=[]",
    "progress=false",
    "plots=false",
    "trainer=cpu",
    "trainer.threads=1",
    "evaluation.num_samples=200",
    "evaluation.metrics=[mmd,sd_ratio,width95_ratio,nlog,lmd]",
    "evaluation.lmd_draws=50",
    "reference.num_samples=200",
    "reference.pilot_simulations=100",
    "reference.max_simulations=3000",
    "reference.importance_particles=60",
    "reference.importance_draws=500",
]
NEURAL = [
    "method.training.max_epochs=2",
    "method.flow={transforms: 2, hidden: 16, blocks: 1, bins: 4, tail_bound: 5.0}",
]
#: A cheap supported task and tiny settings for each method.
TINY = {
    "sppe": [
        "task=poisson_counts",
        "method.rounds=2",
        "method.sims_per_round=100",
        "method.inner_samples=4",
        *NEURAL,
    ],
    "sple": [
        "task=poisson_counts",
        "method.rounds=1",
        "method.sims_per_round=100",
        "method.inner_samples=4",
        "method.mcmc={num_chains: 10, warmup: 10, thin: 1, init_candidates: 100}",
        *NEURAL,
    ],
    "naive_npe": [
        "task=poisson_counts",
        "method.num_simulations=100",
        *NEURAL,
        "evaluation.calibration_runs=20",
        "evaluation.calibration_samples=100",
    ],
    "rejection_abc": ["task=poisson_counts", "method.num_samples=200"],
    "abc_is": ["task=poisson_counts", "method.num_simulations=2000"],
    "smc_abc": ["task=poisson_counts", "method.num_particles=100", "method.tolerance_end=0.5"],
    "abcdp": ["task=regression", "task.epsilon=10", "method.num_accepted=20", "method.max_proposals=2000"],
    "mh_clt": ["task=normal_variance", "task.noise=gaussian", "method.num_iterations=200"],
    "pmmh": ["task=poisson_counts", "method.num_iterations=200", "method.num_particles=20"],
    "mhaar": ["task=binary_responses", "method.num_iterations=200", "method.num_particles=20"],
    "da_mcmc": ["task=regression", "task.epsilon=10", "method.num_iterations=30", "method.num_chains=2"],
    "mcem": ["task=poisson_counts", "+method.stages=[[500,1e-2],[2000,1e-3]]", "method.max_iterations=5"],
}
SIR_SMALL = ["task.population=10000"]  # the stored fractions stay valid releases; simulations 100x cheaper


@pytest.fixture(scope="module", autouse=True)
def hydra_configs():
    """Hydra initialised once for the module (composing is what the tests exercise, not initialising)."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        yield


def config(*overrides: str, hydra: bool = False):
    return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_every_task_and_method_has_a_config():
    directory = config_dir()
    assert sorted(p.stem for p in (directory / "task").glob("*.yaml")) == dpsbi.tasks.names()
    assert sorted(p.stem for p in (directory / "method").glob("*.yaml")) == sorted(METHODS) == sorted(SUPPORT)


@pytest.mark.parametrize("task", TASKS)
def test_every_task_method_pair_composes_and_runs_or_is_refused_clearly(task):
    for method in sorted(METHODS):
        cfg = config(f"task={task}", f"method={method}", "companions=[]")
        if task in SUPPORT[method]:
            assert [m.name for m, _ in plan(cfg).methods] == [method]
        else:
            with pytest.raises(ConfigError) as refusal:
                plan(cfg)
            assert str(refusal.value).startswith(f"method {method!r} cannot run on task {task!r}: ")
            assert len(str(refusal.value)) > 60  # and says why


def test_wall_and_cpu_time_are_the_fitting_time_so_far(tmp_path, monkeypatch):
    """Clocks that tick 10 s a reading: the runner reads each at the start, then twice a round (before and after
    scoring), so the rounds' fitting times so far are 10, 20, 30 s. It reported 10, 30, 60 s before the fix (each
    round added the total so far to the previous round's)."""
    from dpsbi.experiment import runner

    wall, cpu = iter(range(0, 10_000, 10)), iter(range(0, 10_000, 10))
    clocks = types.SimpleNamespace(
        perf_counter=lambda: float(next(wall)), process_time=lambda: float(next(cpu))
    )
    monkeypatch.setattr(runner, "time", clocks)
    cfg = config(
        "method=sppe", *TINY["sppe"], "method.rounds=3", *QUICK, f"reference.cache_dir={tmp_path / 'cache'}"
    )
    run_experiment(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run" / "sppe" / "rounds.json")
    assert [r["wall_time"] for r in rows] == [r["cpu_time"] for r in rows] == [10.0, 20.0, 30.0]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_on_a_tiny_budget(method, tmp_path):
    cfg = config(f"method={method}", *TINY[method], *QUICK, f"reference.cache_dir={tmp_path / 'cache'}")
    summary = run_experiment(cfg, tmp_path / "run")
    (row,) = summary
    assert row["method"] == method and row["num_simulations"] >= 0 and row["wall_time"] > 0
    assert all(math.isfinite(row[m]) for m in ("mmd", "lmd") if m in row)
    if method == "naive_npe":  # amortized: calibrated by SBC and TARP when asked
        assert set(row["calibration"]) == {"sbc_ks_pvalues", "tarp_atc", "tarp_ks_pvalue"}
    draws, names = read_draws(tmp_path / "run" / method / "samples.csv")
    task = dpsbi.tasks.load(cfg.task.name, **{k: v for k, v in cfg.task.items() if k != "name"})
    assert names == task.parameter_names and draws.shape[1] == task.dim_theta and torch.isfinite(draws).all()
    rounds = read_rows(tmp_path / "run" / "metrics")
    assert [r["round"] for r in rounds] == list(range(1, len(rounds) + 1))
    for spread in ("sd_ratio", "width95_ratio"):  # the mean over parameters, and each parameter's
        per_parameter = [rounds[-1][f"{spread}[{name}]"] for name in task.parameter_names]
        assert rounds[-1][spread] == pytest.approx(sum(per_parameter) / len(per_parameter))
        assert all(0 < r < 100 for r in per_parameter)
    assert all(
        (tmp_path / "run" / method / "rounds" / f"round_{r['round']:02d}.pt").is_file() for r in rounds
    )
    assert (tmp_path / "run" / method / ("posterior.pt" if METHODS[method].neural else "result.pt")).is_file()


@pytest.mark.parametrize("task", TASKS)
def test_every_task_runs(task, tmp_path):
    """A cheap baseline on each task (SMC-ABC, which runs everywhere; exact importance ABC on the discrete
    randomized-response release, where a Euclidean tolerance accepts nothing), scored against its reference."""
    method = (
        ["method=abc_is", "method.num_simulations=500"]
        if task == "binary_responses"
        else [
            "method=smc_abc",
            "method.num_particles=60",
            "method.tolerance_end=0.7",
            "method.max_simulations=20000",
        ]
    )
    extra = SIR_SMALL if task.startswith("sir") else []
    cfg = config(f"task={task}", *method, *extra, *QUICK, f"reference.cache_dir={tmp_path / 'cache'}")
    (row,) = run_experiment(cfg, tmp_path / "run")
    reference = json.loads((tmp_path / "run" / "reference.json").read_text())
    expected = (
        "none"
        if task in OUTBREAKS
        else "closed_form"
        if task in ("poisson_counts", "conjugate_gaussian")
        else None
    )
    assert row["reference"] == reference["kind"] and (expected is None or reference["kind"] == expected)
    assert ("mmd" in row) == (reference["kind"] != "none")
    if not reference["exact"]:
        assert reference["kind"] == "none" or reference["note"].startswith("APPROXIMATE")


def test_rejection_abc_scores_like_the_exact_reference(tmp_path):
    """Exact draws against exact draws: C2ST within 4 binomial sd of chance (the scoring pipeline is unbiased)."""
    n = 400
    cfg = config(
        "task=poisson_counts",
        "method=rejection_abc",
        f"method.num_samples={n}",
        *QUICK,
        f"evaluation.num_samples={n}",
        f"reference.num_samples={n}",
        "evaluation.metrics=[c2st]",
        f"reference.cache_dir={tmp_path}",
    )
    (row,) = run_experiment(cfg, tmp_path / "run")
    assert abs(row["c2st"] - 0.5) < 4 * math.sqrt(0.25 / (2 * n))


def test_reference_is_exact_and_cached(tmp_path, monkeypatch):
    task = dpsbi.tasks.load("poisson_counts")
    settings = dict(
        pilot_simulations=200, max_simulations=10**6, importance_particles=100, importance_draws=2000
    )
    ref = reference_posterior(
        task, {"name": "poisson_counts"}, "rejection", 2000, tmp_path, seed=0, progress=False, **settings
    )
    assert ref.kind == "rejection" and ref.exact and ref.samples.shape == (2000, 1)
    exact = task.exact_posterior(task.y_obs)
    assert abs(float(ref.samples.mean()) - float(exact.mean)) < 4 * float(exact.variance.sqrt()) / math.sqrt(
        2000
    )
    assert len(list(tmp_path.rglob("*.pt"))) == 1 and "poisson_counts" in str(next(tmp_path.rglob("*.pt")))

    def no_simulation(*args, **kwargs):
        raise AssertionError("a cached reference must not be simulated again")

    monkeypatch.setattr(dpsbi.baselines, "rejection_abc", no_simulation)
    again = reference_posterior(
        task, {"name": "poisson_counts"}, "rejection", 2000, tmp_path, seed=0, progress=False, **settings
    )
    assert torch.equal(again.samples, ref.samples) and again.note == ref.note


def test_reference_settings_left_out_take_the_configs_values_and_unknown_ones_are_named(tmp_path):
    """A user's call needs no settings copied from configs/config.yaml (it raised KeyError: 'pilot_simulations')."""
    from omegaconf import OmegaConf

    from dpsbi.experiment.config import config_dir
    from dpsbi.experiment.reference import SETTINGS

    block = OmegaConf.load(config_dir() / "config.yaml").reference
    assert {key: block[key] for key in SETTINGS} == SETTINGS
    task = dpsbi.tasks.load("poisson_counts")
    ref = reference_posterior(task, {"name": "poisson_counts"}, "auto", 500, tmp_path, progress=False)
    assert ref.samples.shape == (500, 1)
    with pytest.raises(ValueError, match=r"unknown reference settings \['pilot_sims'\]"):
        reference_posterior(task, {"name": "poisson_counts"}, "auto", 500, tmp_path, pilot_sims=10)


def test_a_changed_model_under_the_same_name_never_reuses_a_cached_reference(tmp_path):
    """The cache key covers the prior and the simulator: a custom model edited under the same name and
    config (here its simulator shifted by 3, then its prior widened) gets its own reference."""
    settings = dict(
        pilot_simulations=200, max_simulations=10**6, importance_particles=100, importance_draws=2000
    )

    def reference(prior_sd: float, shift: float):
        task = dpsbi.from_simulator(
            dpsbi.tasks.normal(0.0, prior_sd), lambda theta: theta + shift, Laplace(1.0, 1.0, dim=1), [0.0]
        )
        return reference_posterior(
            task,
            {"name": "custom", "factory": "mymodel:make"},
            "rejection",
            500,
            tmp_path,
            progress=False,
            **settings,
        ).samples

    first, shifted, wider = reference(1.0, 0.0), reference(1.0, 3.0), reference(3.0, 3.0)
    assert float(first.mean()) - float(shifted.mean()) > 0.5  # moved by 1.0, Monte Carlo sd 0.05
    assert float(wider.std()) > 1.2 * float(shifted.std())
    assert len(list(tmp_path.rglob("*.pt"))) == 3


def test_importance_reference_matches_the_exact_posterior(tmp_path):
    task = dpsbi.tasks.load("poisson_counts")
    settings = dict(
        pilot_simulations=200, max_simulations=10**6, importance_particles=500, importance_draws=200_000
    )
    ref = reference_posterior(
        task, {"name": "poisson_counts"}, "importance", 2000, tmp_path, seed=0, progress=False, **settings
    )
    assert ref.kind == "importance" and not ref.exact
    ess = float(ref.note.split("ESS ")[1].split(";")[0])
    assert ess > 20_000, ref.note  # the fitted proposal keeps most draws useful
    torch.manual_seed(1)
    exact = task.exact_posterior(task.y_obs).sample((20_000,))
    assert scipy.stats.ks_2samp(ref.samples[:, 0].numpy(), exact[:, 0].numpy()).pvalue > 0.01


def test_sir_reference_says_it_is_approximate(tmp_path):
    task = dpsbi.tasks.load("sir", epsilon=10.0, population=10000)
    ref = reference_posterior(
        task,
        {"name": "sir", "population": 10000},
        "auto",
        100,
        tmp_path,
        seed=0,
        progress=False,
        pilot_simulations=100,
        max_simulations=10**5,
        importance_particles=60,
        importance_draws=500,
    )
    assert (
        ref.kind == "importance"
        and not ref.exact
        and ref.note.startswith("APPROXIMATE")
        and "ESS" in ref.note
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task.name=nope"], "unknown task 'nope'; known tasks: binary_responses"),
        (["task.epsilon=0"], "task.epsilon must be a finite number > 0, got 0"),
        (["task.epsilon=-1"], "task.epsilon must be a finite number > 0, got -1"),
        (["task.epsilon=5"], "no stored release at epsilon=5"),
        (["task=conjugate_gaussian", "task.y_obs=[1.0]"], "release must have shape"),
        (["method.name=nope"], "unknown method 'nope'; known methods: abc_is"),
        (["companions=[nope]"], "unknown companion method 'nope'"),
        (["evaluation.metrics=[c2st,accuracy]"], "unknown metrics ['accuracy']"),
        (["trainer.threads=0"], "trainer.threads must be a positive integer"),
        (["budget.rounds=0"], "budget.rounds must be a positive integer or null, got 0"),
        (
            ["budget.sims_per_round=many"],
            "budget.sims_per_round must be a positive integer or null, got 'many'",
        ),
        (["budget.max_epochs=1.5"], "budget.max_epochs must be a positive integer or null, got 1.5"),
        (
            ["+budget.epochs=3"],
            "unknown budget keys ['epochs']; known: rounds, sims_per_round, inner_samples, max_epochs, max_steps",
        ),
        (
            ["method=sple", "budget.inner_samples=3"],
            "method 'sple': RQMC (qmc=True) needs inner_samples a power of two, got 3",
        ),
        # bool("no") is true: a switch given as a word is refused, not read as on
        (["progress=no"], "progress must be True or False, got 'no' (str)"),
        (["method.amortized=yes"], "method 'sppe': amortized must be True or False, got 'yes' (str)"),
        (["method.rounds=2.5"], "method 'sppe': rounds must be an integer >= 1, got 2.5"),
    ],
)
def test_bad_config_values_fail_at_start(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        run_experiment(config(*overrides), tmp_path / "run")
    assert message in str(error.value)
    assert not (tmp_path / "run").exists()  # nothing was run or written


def test_one_budget_sets_every_neural_method():
    cfg = config(
        "method=sppe",
        "companions=[sple,naive_npe,smc_abc]",
        "trainer=cpu",
        "+method_settings.sppe.rounds=5",
        "budget.rounds=1",
        "budget.sims_per_round=50",
        "budget.inner_samples=8",
        "budget.max_epochs=3",
    )
    settings = {method.name: s for method, s in plan(cfg).methods}
    assert list(settings) == ["sppe", "sple", "naive_npe", "smc_abc"]
    for name in ("sppe", "sple"):  # the budget overrides the method configs and method_settings
        assert (settings[name]["rounds"], settings[name]["sims_per_round"]) == (1, 50)
    assert settings["naive_npe"]["num_simulations"] == 50  # rounds x sims_per_round, in its one round
    assert not {"rounds", "sims_per_round"} & set(settings["naive_npe"])
    for name in ("sppe", "sple", "naive_npe"):
        training = settings[name]["training"]
        assert training["max_epochs"] == 3 and training["patience"] == 20 and training["accelerator"] == "cpu"
    assert (
        settings["sppe"]["inner_samples"] == settings["sple"]["inner_samples"] == 8
        and "inner_samples" not in settings["naive_npe"]
    )
    assert not {"rounds", "training"} & set(settings["smc_abc"])  # the classical baselines ignore it
    unset = {method.name: s for method, s in plan(config("companions=[sple,naive_npe]")).methods}
    assert (
        unset["sppe"]["rounds"],
        unset["sple"]["sims_per_round"],
        unset["naive_npe"]["training"]["max_steps"],
    ) == (None, None, 500)  # None: SPPE 10 rounds (or a recipe), SPLE 1000 a round (amortized: more)
    assert unset["naive_npe"]["num_simulations"] == 10_000
    for budget, total in (
        (["budget.rounds=3"], 3000),
        (["budget.sims_per_round=40"], 400),
    ):  # SPPE's other one
        half = {m.name: s for m, s in plan(config("companions=[naive_npe]", *budget)).methods}
        assert half["naive_npe"]["num_simulations"] == total


@pytest.mark.parametrize("method", ["sppe", "sple", "naive_npe"])
def test_the_method_configs_are_the_library_defaults(method):
    """``dpsbi-run method=sppe`` fits what ``dpsbi.SPPE(task)`` fits: dpsbi/configs/method/*.yaml state the defaults."""
    ((chosen, settings),) = plan(config(f"method={method}", "companions=[]", "trainer=cpu")).methods
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    assert (
        chosen.load()(task, **settings, progress=False).fingerprint()
        == chosen.load()(task, training=dict(accelerator="cpu"), progress=False).fingerprint()
    )


@pytest.mark.parametrize("method", ["sppe", "sple", "naive_npe"])
def test_the_paper_preset_is_the_python_paper_preset(method):
    """``experiment=paper`` builds each neural method exactly as ``Estimator.paper(task)`` does: the paper's
    budget, M = 32 RQMC, 10 atoms, constant lr 5e-4, open-ended rounds with patience 20."""
    cfg = config("experiment=paper", f"method={method}", "trainer=cpu")
    ((chosen, settings),) = plan(cfg).methods
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    from_config = chosen.load()(task, **settings, progress=False).fingerprint()
    paper = chosen.load().paper(task, training=dict(accelerator="cpu"), progress=False).fingerprint()
    assert from_config == paper
    assert paper["rounds"] * paper["sims_per_round"] == 10_000 and paper["rounds"] == (
        1 if method == "naive_npe" else 10
    )
    assert (
        paper["training"]["lr_schedule"] == "constant"
        and paper["training"]["max_epochs"] is None is paper["training"]["max_steps"]
    )
    assert method == "naive_npe" or (paper["inner_samples"], paper["qmc"]) == (32, True)
    assert paper.get("atoms", 10) == 10


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of cuda on a machine without one")
def test_cuda_without_a_gpu_fails_at_start(tmp_path):
    with pytest.raises(ConfigError, match="^trainer.accelerator=cuda but no CUDA device is visible"):
        run_experiment(config("trainer=cuda"), tmp_path / "run")
    # named as the user wrote it
    with pytest.raises(ConfigError, match="^trainer.accelerator=gpu but no CUDA"):
        run_experiment(config("trainer=cuda", "trainer.accelerator=gpu"), tmp_path / "run")


def test_unknown_task_group_lists_the_options():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="regression"):
        config("task=nope")


def test_presets_and_launchers_compose():
    for preset in sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml")):
        cfg = config(f"experiment={preset}", hydra=True)
        # every preset runs SPPE for 10 rounds: the paper's settings, or the library's defaults (results, sir_exact,
        # sir_outbreaks set none of their own)
        sppe = cfg.method_settings.get("sppe", {})
        assert cfg.companions == [] and sppe.get("rounds", cfg.method.rounds or 10) == 10, preset  # None: 10
        for method in str((cfg.hydra.sweeper.params or {}).get("method", "sppe")).split(","):
            assert method in METHODS
    cfg = config("hydra/launcher=local", hydra=True)
    assert "JoblibLauncher" in cfg.hydra.launcher._target_
    assert config("experiment=sir_eps1").task.epsilon == 1.0


def _cli(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / name
    env = {**os.environ, "DPSBI_CACHE": str(cwd / "cache"), "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_method_out_of_simulation_budget_ends_in_one_line(tmp_path):
    run = _cli(
        "dpsbi-run",
        "task=poisson_counts",
        "method=rejection_abc",
        "method.num_samples=200",
        "method.batch_size=100",
        "method.max_simulations=200",
        *QUICK,
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "dpsbi-run: out of simulation budget: rejection_abc hit max_simulations=200" in run.stderr


def test_dpsbi_run_sweep_then_sample_and_compare(tmp_path, capsys):
    naive = "{num_simulations: 100, training: {max_epochs: 10}, flow: {transforms: 2, hidden: 16, blocks: 1, bins: 4, tail_bound: 5.0}}"
    # mhaar cannot run on poisson_counts (no record model): the sweep goes on, then says so and exits 1.
    sweep = _cli(
        "dpsbi-run",
        "-m",
        "task=poisson_counts",
        "method=naive_npe,mhaar,rejection_abc",
        f"+method_settings.naive_npe={naive}",
        "+method_settings.rejection_abc.num_samples=200",
        *QUICK,
        "plots=true",
        f"hydra.sweep.dir={tmp_path / 'multi'}",
        cwd=tmp_path,
    )
    assert sweep.returncode == 1, sweep.stderr[-3000:]
    assert "1 job(s) of the sweep could not run" in sweep.stderr and "1_poisson_counts" in sweep.stderr
    assert (
        "method 'mhaar' cannot run on task 'poisson_counts'" in sweep.stderr
        and "Traceback" not in sweep.stderr
    )
    runs = sorted((tmp_path / "multi").glob("*/summary.json"))
    assert (
        len(runs) == 2 and (tmp_path / "multi" / "comparison.png").is_file()
    )  # the sweep-end callback compared them
    assert "naive_npe" in sweep.stdout and "rejection_abc" in sweep.stdout
    naive, rejection = (p.parent for p in runs)
    assert {p.name for p in naive.glob("*.png")} == {"pairplot.png", "metrics.png", "ppc.png"}

    out = _cli("dpsbi-sample", str(naive), "--release", "45", "-n", "300", "-o", "draws45.csv", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    high, names = read_draws(tmp_path / "draws45.csv")
    assert names == ["theta"] and high.shape == (300, 1) and "mean" in out.stdout
    (tmp_path / "low.txt").write_text("20\n")
    cli.sample(
        [
            str(naive / "naive_npe" / "posterior.pt"),
            "--release-file",
            str(tmp_path / "low.txt"),
            "-n",
            "300",
            "-o",
            str(tmp_path / "draws20.csv"),
        ]
    )
    assert (
        high.mean() > read_draws(tmp_path / "draws20.csv")[0].mean()
    )  # an amortized posterior follows the release

    with pytest.raises(SystemExit, match=r"release must have shape \(n, 1\)"):
        cli.sample([str(naive), "--release", "1,2"])
    with pytest.raises(SystemExit, match="cannot be sampled at a new release"):
        cli.sample([str(rejection), "--release", "20"])
    (tmp_path / "multi" / "comparison.png").unlink()
    with pytest.raises(
        SystemExit, match=r"dpsbi-compare: 1 job\(s\) of the sweep could not run:\n  1_poisson_counts"
    ):
        cli.compare([str(tmp_path / "multi")])  # lists the mhaar point, as the sweep's end did
    assert (tmp_path / "multi" / "comparison.png").is_file() and "rejection_abc" in capsys.readouterr().out


def test_dpsbi_run_reports_a_bad_value_in_one_line(tmp_path):
    out = _cli("dpsbi-run", "task.epsilon=-1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode != 0
    assert "dpsbi-run: config error: task.epsilon must be a finite number > 0, got -1" in out.stderr
    assert "Traceback" not in out.stderr


def test_dpsbi_run_refuses_a_negative_seed_before_writing_anything(tmp_path):
    out = _cli("dpsbi-run", "seed=-1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "dpsbi-run: config error: seed must be an integer from 0 to 2**63 - 1, got -1" in out.stderr
    assert not any((tmp_path / "run").iterdir())  # no config.yaml, no reference


def test_dpsbi_run_names_a_run_directory_it_cannot_write(tmp_path):
    """A file in the way, and (where permissions bind: not as root) a read-only folder: one line, not Hydra's
    traceback."""
    (tmp_path / "blocked").write_text("")
    targets = [tmp_path / "blocked" / "run"]
    if os.geteuid() != 0:
        (tmp_path / "readonly").mkdir(mode=0o555)
        targets.append(tmp_path / "readonly" / "run")
    for target in targets:
        out = _cli("dpsbi-run", f"hydra.run.dir={target}", cwd=tmp_path)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert (
            out.stderr.strip()
            .splitlines()[-1]
            .startswith(f"dpsbi-run: cannot write the run directory {target} (")
        )
        assert out.stderr.strip().endswith("choose a writable one with hydra.run.dir=...")


def test_dpsbi_compare_skips_unreadable_summaries_by_name_and_lists_failed_runs(tmp_path, capsys):
    """A summary.json that is not JSON, has no rows, or has rows of the wrong shape is skipped with one line naming
    it and the problem (never a traceback, never a wrong row in the table); a run that left error.txt is listed
    after the table and the exit status says so, as at the end of a sweep."""
    row = {"task": "poisson_counts", "epsilon": 0.2, "method": "rejection_abc", "round": 1}
    row |= {"num_simulations": 200, "wall_time": 0.1, "lmd": 2.3, "reference": "none"}
    summaries = {
        "0_good": json.dumps({"reference": {"kind": "none"}, "runs": [row]}),
        "1_corrupt": "{bad",
        "2_no_runs": '{"x": 1}',
        "3_wrong_task": '{"runs": [{"task": 3}]}',
        "4_no_wall_time": json.dumps({"runs": [{k: v for k, v in row.items() if k != "wall_time"}]}),
        "5_text_metric": json.dumps({"runs": [{**row, "lmd": "2.3"}]}),
    }
    for name, text in summaries.items():
        (tmp_path / "multi" / name).mkdir(parents=True)
        (tmp_path / "multi" / name / "summary.json").write_text(text)
    (tmp_path / "multi" / "6_failed").mkdir()
    (tmp_path / "multi" / "6_failed" / "error.txt").write_text("dpsbi-run: config error: bad epsilon\n")

    with pytest.raises(SystemExit) as exit_:
        cli.compare([str(tmp_path / "multi")])
    assert (
        exit_.value.code
        == "dpsbi-compare: 1 job(s) of the sweep could not run:\n  6_failed: dpsbi-run: config error: bad epsilon"
    )
    out, err = capsys.readouterr()
    skipped = [line for line in err.splitlines() if line.startswith("dpsbi-compare: skipped ")]
    assert len(skipped) == 5 and len(err.splitlines()) == 5 and "Traceback" not in err, err
    for line, problem in zip(
        skipped,
        [
            "not JSON",
            "no list of rows under 'runs'",
            "runs[0].task is 3, not text",
            "runs[0] has no 'wall_time'",
        ]
        + ['runs[0].lmd is "2.3", not a number or null'],
    ):
        assert problem in line and "summary.json" in line, line
    assert [r["run"] for r in read_rows(tmp_path / "multi" / "comparison")] == ["0_good"]
    assert "0_good" in out and "3_wrong_task" not in out and (tmp_path / "multi" / "comparison.png").is_file()

    (tmp_path / "multi" / "0_good" / "summary.json").write_text("[]")  # no run left to compare: one line
    (tmp_path / "multi" / "6_failed" / "error.txt").unlink()
    with pytest.raises(
        SystemExit, match=r"^dpsbi-compare: error: no finished runs \(summary.json\) below .*multi$"
    ):
        cli.compare([str(tmp_path / "multi")])
