"""Reliability of runs and of the reference cache: damaged, unwritable and shared cache entries; unique and
locked run directories; finished runs and sweeps rerun, killed runs resumed to the uninterrupted result;
bad method settings refused before any simulation."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from test_experiments import config, hydra_configs  # noqa: F401  (autouse fixture: Hydra initialised for the module)

import dpsbi
from dpsbi.experiment import ConfigError, methods, reference, run_experiment, runner
from dpsbi.experiment.outputs import read_rows
from dpsbi.files import exclusive

#: The smallest budgets: a closed-form reference (nothing to simulate for it) and cheap metrics.
QUICK = [
    "task=conjugate_gaussian",
    "companions=[]",
    "progress=false",
    "plots=false",
    "trainer=cpu",
    "evaluation.num_samples=200",
    "evaluation.metrics=[mmd,nlog,lmd]",
    "evaluation.lmd_draws=50",
]
FLOW = "{transforms: 2, hidden: 16, blocks: 1, bins: 4, tail_bound: 5.0}"
REJECTION = ["method=rejection_abc", "method.num_samples=200"]


def sppe_budget(rounds: int) -> str:
    """SPPE's budget as a ``method_settings`` override (it then holds as main method and as companion)."""
    return f"+method_settings.sppe={{rounds: {rounds}, sims_per_round: 100, inner_samples: 4, training: {{max_epochs: 2}}, flow: {FLOW}}}"


#: ``dpsbi-run`` that SIGKILLs itself once SPPE's first round is recorded (its row in ``rounds.json``, then its
#: scored checkpoint). A watcher polling ``rounds.json`` killed at a time that depended on the machine's load:
#: before the checkpoint copy (the resumed run then rightly redid round 1, with a new wall time) or after
#: later rounds, and the test failed now and then.
KILLED_AFTER_FIRST_SPPE_ROW = """
import os, signal, sys
from dpsbi.experiment import runner
copy = runner._copy
def copy_then_die(source, target):
    copy(source, target)
    if target.name == runner.SCORED_CHECKPOINT and "sppe" in target.parts:
        os.kill(os.getpid(), signal.SIGKILL)
runner._copy = copy_then_die
from dpsbi.cli import run
sys.argv = ["dpsbi-run", *sys.argv[1:]]
run()
"""


def _cli(*args: str, cwd: Path, output=subprocess.PIPE, program: str | None = None) -> subprocess.Popen:
    """``dpsbi-run args`` (or ``python -c program args``) started in ``cwd`` with the reference cache in
    ``cwd/cache``; stdout and stderr to pipes, or both to the file ``output``."""
    env = {**os.environ, "DPSBI_CACHE": str(cwd / "cache"), "HYDRA_FULL_ERROR": "0"}
    command = (
        [str(Path(sys.executable).parent / "dpsbi-run")]
        if program is None
        else [sys.executable, "-c", program]
    )
    errors = subprocess.PIPE if output is subprocess.PIPE else subprocess.STDOUT
    return subprocess.Popen([*command, *args], cwd=cwd, env=env, stdout=output, stderr=errors, text=True)


def _snapshot(directory: Path) -> dict[str, int]:
    """Every file below ``directory`` with its modification time (ns)."""
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _results(run: Path) -> tuple[dict[str, str], list[dict]]:
    """A finished run's draws (every ``samples*.csv``) and metric rows without their wall and CPU times."""
    samples = {str(p.relative_to(run)): p.read_text() for p in sorted(run.glob("*/samples*.csv"))}
    timing = ("wall_time", "cpu_time")
    return samples, [{k: v for k, v in row.items() if k not in timing} for row in read_rows(run / "metrics")]


# ---- reference cache ----------------------------------------------------------------------------------------
POISSON = dict(pilot_simulations=200, max_simulations=10**5, importance_particles=60, importance_draws=500)


def _reference(cache_dir):
    """Exact rejection-ABC reference draws (200) of poisson_counts, cached in ``cache_dir``."""
    task = dpsbi.tasks.load("poisson_counts")
    return reference.reference_posterior(
        task, {"name": "poisson_counts"}, "rejection", 200, cache_dir, seed=0, progress=False, **POISSON
    )


def test_a_damaged_cache_entry_is_recomputed_with_a_warning_naming_it(tmp_path):
    first = _reference(tmp_path)
    (entry,) = tmp_path.rglob("*.pt")
    assert json.loads(entry.with_suffix(".json").read_text())["kind"] == "rejection"
    entry.write_bytes(entry.read_bytes()[:200])  # truncated, as by a full disk or a killed copy
    with pytest.warns(UserWarning, match=f"{entry}.*recomputing") as caught:
        again = _reference(tmp_path)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert torch.equal(again.samples, first.samples)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the entry was replaced: it loads silently now
        assert torch.equal(_reference(tmp_path).samples, first.samples)


@pytest.mark.parametrize("failure", ["no lock", "no write"])
def test_an_unwritable_cache_still_gives_the_reference(failure, tmp_path, monkeypatch):
    expected = _reference(None).samples
    if failure == "no lock":  # the cache directory cannot even be created
        (tmp_path / "file").write_text("")
        cache = tmp_path / "file" / "cache"
    else:  # the lock works, the entry cannot be written (a read-only or full disk)
        cache = tmp_path / "cache"

        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(reference, "save_sealed", denied)
    with pytest.warns(UserWarning, match="reference cache .* is not writable") as caught:
        ref = _reference(cache)
    assert str(cache / "poisson_counts") in str(caught[0].message)
    assert torch.equal(ref.samples, expected)


def test_concurrent_runs_sharing_a_cache_compute_an_entry_once(tmp_path, monkeypatch):
    rejection = reference._rejection
    calls = []

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(0.5)  # long enough for the other thread to reach the entry's lock
        return rejection(*args, **kwargs)

    monkeypatch.setattr(reference, "_rejection", slow)
    results = [None, None]

    def job(i):
        results[i] = _reference(tmp_path)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and torch.equal(results[0].samples, results[1].samples)


# ---- run directories ------------------------------------------------------------------------------------------
def test_default_run_and_sweep_directories_are_unique():
    a, b = config(hydra=True), config(hydra=True)
    assert a.hydra.run.dir != b.hydra.run.dir and a.hydra.sweep.dir != b.hydra.sweep.dir
    token = a.hydra.run.dir.rsplit("_", 1)[1]
    assert (
        len(token) == 6 and a.hydra.run.dir == a.hydra.run.dir and a.hydra.sweep.dir.endswith(token)
    )  # one token per config


def test_a_run_into_a_busy_directory_is_refused_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")  # another run's
    with exclusive(run / ".lock", "a run"):
        before = _snapshot(run)
        process = _cli(*QUICK, *REJECTION, f"hydra.run.dir={run}", cwd=tmp_path)
        _, err = process.communicate(timeout=300)
    assert process.returncode != 0
    assert f"dpsbi-run: another dpsbi-run is writing to {run}" in err and "Traceback" not in err
    assert _snapshot(run) == before


def test_a_finished_run_is_reported_not_recomputed_and_another_config_is_refused(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    summary = run_experiment(config(*QUICK, *REJECTION), run)
    before = _snapshot(run)

    def no_fit(*args, **kwargs):
        raise AssertionError("a finished run must not be fitted again")

    monkeypatch.setattr(methods, "fit", no_fit)
    capsys.readouterr()
    again = run_experiment(
        config(*QUICK, *REJECTION, "progress=true", "plots=true"), run
    )  # keys that cannot change results
    out = capsys.readouterr().out
    assert again == summary and "rejection_abc" in out and f"{run}: already finished" in out
    assert _snapshot(run) == before
    with pytest.raises(ConfigError) as refusal:
        run_experiment(config(*QUICK, *REJECTION, "method.num_samples=300", "seed=1"), run)
    assert str(refusal.value).startswith(
        f"{run} holds a run of another config (method.num_samples: 200 vs 300; seed: 0 vs 1)"
    )
    assert "\n" not in str(refusal.value) and _snapshot(run) == before
    # a damaged summary of the finished run is refused in one line (it was a JSONDecodeError traceback)
    (run / "summary.json").write_text('{"runs": [{"task": 3}]')
    with pytest.raises(ConfigError) as damaged:
        run_experiment(config(*QUICK, *REJECTION), run)
    assert str(damaged.value).startswith(f"{run / 'summary.json'} is damaged: not JSON")
    assert "delete it to run this config again there" in str(damaged.value) and "\n" not in str(damaged.value)


def test_a_sweep_rerun_skips_its_finished_points_and_runs_the_rest(tmp_path):
    sweep, budgets = tmp_path / "multi", [sppe_budget(2), "+method_settings.rejection_abc.num_samples=200"]
    run_experiment(
        config(*QUICK, "method=sppe", *budgets), sweep / "0_conjugate_gaussian_eps1.0_sppe"
    )  # finished before
    before = _snapshot(sweep / "0_conjugate_gaussian_eps1.0_sppe")
    process = _cli(
        "-m", *QUICK, "method=sppe,rejection_abc", *budgets, f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    assert out.count("already finished") == 1
    assert _snapshot(sweep / "0_conjugate_gaussian_eps1.0_sppe") == before
    assert (sweep / "1_conjugate_gaussian_eps1.0_rejection_abc" / "summary.json").is_file()
    assert (sweep / "comparison.csv").is_file()


# ---- killed runs ----------------------------------------------------------------------------------------------
class Killed(Exception):
    """Stands for a kill inside the runner."""


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """rejection_abc, then SPPE over 3 rounds: SIGKILL right after SPPE's first row is written, resume (rejection_abc
    is read back, SPPE continues from round 1), kill again between round 3's checkpoint and its row, resume:
    the draws and metrics are those of an uninterrupted run, with the wall time before the kills counted."""
    overrides = [
        *QUICK,
        *REJECTION,
        "companions=[sppe]",
        sppe_budget(3),
        f"reference.cache_dir={tmp_path / 'cache'}",
    ]
    killed, log = tmp_path / "killed", tmp_path / "killed.log"
    with log.open("w") as output:  # not a pipe: nobody reads it while the run goes on
        process = _cli(
            *overrides,
            f"hydra.run.dir={killed}",
            cwd=tmp_path,
            output=output,
            program=KILLED_AFTER_FIRST_SPPE_ROW,
        )
    run_experiment(config(*overrides), tmp_path / "whole")  # meanwhile, the uninterrupted run
    process.wait()
    assert process.returncode == -signal.SIGKILL and not (killed / "sppe" / "complete").exists(), (
        log.read_text()[-3000:]
    )
    before_kill = read_rows(killed / "sppe" / "rounds.json")
    assert [r["round"] for r in before_kill] == [1]
    before_kill[0]["wall_time"] = 1000.0  # as if round 1 had taken that long: later rows must count it
    (killed / "sppe" / "rounds.json").write_text(json.dumps(before_kill))

    fitted, calls = [], []
    fit, score = methods.fit, runner.Scorer.__call__

    def recording_fit(method, *args, **kwargs):
        fitted.append(method.name)
        return fit(method, *args, **kwargs)

    def killed_at_round_3(self, draws):
        calls.append(1)
        if (
            len(calls) == 2
        ):  # SPPE round 3 (rounds 2 and 3 are trained now): its checkpoint is saved, its row not
            raise Killed()
        return score(self, draws)

    monkeypatch.setattr(methods, "fit", recording_fit)
    monkeypatch.setattr(runner.Scorer, "__call__", killed_at_round_3)
    with pytest.raises(Killed):
        run_experiment(config(*overrides), killed)
    assert fitted == ["sppe"]  # rejection_abc was complete: read back
    monkeypatch.setattr(runner.Scorer, "__call__", score)
    run_experiment(config(*overrides), killed)

    assert _results(killed) == _results(tmp_path / "whole")
    rows = read_rows(killed / "metrics")
    assert rows[1] == before_kill[0]  # SPPE's round 1, as written before the kill
    assert 1000 < rows[2]["wall_time"] < rows[3]["wall_time"] < 1100


@pytest.mark.parametrize("lost", ["summary.json", "naive_npe/complete"])
def test_a_run_killed_after_training_ends_trains_nothing_again(lost, tmp_path):
    """Killed before the run's summary (the method is read back, its calibration computed from its saved
    posterior) or before the method's completion mark (the estimator resumes with no round left to train)."""
    overrides = [
        *QUICK,
        "method=naive_npe",
        "method.num_simulations=100",
        "method.training.max_epochs=2",
        f"method.flow={FLOW}",
        "evaluation.calibration_runs=20",
        "evaluation.calibration_samples=50",
    ]
    run = tmp_path / "run"
    summary = run_experiment(config(*overrides), run)
    (run / lost).unlink()
    scored = (run / "naive_npe" / "rounds" / "round_01.pt").stat().st_mtime_ns
    assert run_experiment(config(*overrides), run) == summary
    assert (
        run / "naive_npe" / "rounds" / "round_01.pt"
    ).stat().st_mtime_ns == scored  # no round trained or scored again


def test_a_y_obs_outside_a_methods_training_releases_is_a_table_column_not_a_warning(tmp_path, capsys):
    """NaiveNPE trains on noiseless summaries, so a y_obs far out (here 8 sds) lies outside them: the run says so
    in its table and summary.json instead of a warning in the middle of its progress bars."""
    overrides = [
        *QUICK,
        "task.y_obs=[8.0, 0.0]",
        "method=naive_npe",
        "method.num_simulations=200",
        "method.training.max_epochs=2",
        f"method.flow={FLOW}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (row,) = run_experiment(config(*overrides), tmp_path / "run")
    assert row["y_obs_outside"] == "yes"
    assert row["y_obs_outside_detail"].startswith(
        "NaiveNPE: task 'conjugate_gaussian''s y_obs lies outside the 200 simulated releases"
    )
    assert (
        "theta_1" not in row["y_obs_outside_detail"]
        and "y0 = 8 (training releases span" in row["y_obs_outside_detail"]
    )
    out = capsys.readouterr().out
    assert "y_obs_outside" in out.splitlines()[1] and "expected of naive_npe" in out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["runs"][0]["y_obs_outside"] == "yes"


# ---- method settings ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["method.rounds=0"], "method 'sppe': .*rounds"),  # the main method is sppe
        (["method.sims_per_round=-5"], "method 'sppe': .*sims_per_round"),
        (["method.qmc=true", "method.inner_samples=3"], "method 'sppe': .*inner_samples"),
        (["method.flow.hidden=0"], "method 'sppe': .*hidden"),
        (
            ["companions=[naive_npe]", "+method_settings.naive_npe.num_simulations=1"],
            "method 'naive_npe': .*num_simulations must be an integer >= 2",
        ),
        (  # NaiveNPE trains one round: the sequential methods' keys point to num_simulations
            ["companions=[naive_npe]", "+method_settings.naive_npe.sims_per_round=100"],
            "method 'naive_npe': .*'sims_per_round'.*one round: .*num_simulations",
        ),
        (["method.training.patience=0"], "method 'sppe': .*patience"),
        (["+method.max_epochs=2"], r"method 'sppe': .*training=dict\(max_epochs=2\)"),
        (["+method.foo=1"], "method 'sppe': .*'foo'"),
        (["method=smc_abc", "+method.foo=1"], "method 'smc_abc': .*'foo'.*; it takes num_particles"),
    ],
)
def test_bad_method_settings_fail_in_one_line_before_any_simulation(
    overrides, message, tmp_path, monkeypatch
):
    def no_reference(*args, **kwargs):
        raise AssertionError("the reference must not be computed for a config that cannot run")

    monkeypatch.setattr(runner, "reference_posterior", no_reference)
    with pytest.raises(ConfigError, match=message) as error:
        run_experiment(config(*QUICK, *overrides), tmp_path / "run")
    assert "\n" not in str(error.value) and not (tmp_path / "run").exists()
