"""dpsbi at home with ArviZ: posteriors and baseline results in ArviZ's format (named parameters, MCMC chains
kept, release / epsilon / method / settings as attributes), one ESS / R-hat implementation (ArviZ's), SPLE's
R-hat and ESS in the run's summary, and the posterior predictive check plot.

The file runs under both ArviZ majors: the main environment's ArviZ 0.x (``arviz.InferenceData``) and, by
``make test-arviz1``, ArviZ 1.x (an xarray ``DataTree``)."""

import json
import math
import warnings

import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
import torch
from test_experiments import NEURAL, QUICK, config, hydra_configs  # noqa: F401  (autouse: Hydra initialised)

import dpsbi
from dpsbi import diagnostics
from dpsbi.baselines import abc_is, pmmh
from dpsbi.experiment import methods, run_experiment
from dpsbi.experiment.outputs import format_table
from dpsbi.experiment.plots import ppc_plot
from dpsbi.inference import FlowPosterior, FlowSettings, LikelihoodPosterior
from dpsbi.inference.flows import ConditionalFlow

matplotlib.use("Agg")
az = diagnostics._arviz()
#: ``InferenceData`` (ArviZ 0.x) or ``DataTree`` (1.x), and the plots that read the same data in each.
KIND = {0: "InferenceData", 1: "DataTree"}[diagnostics.arviz_major()]
PLOTS = {
    0: dict(
        plot_trace=dict(compact=True), plot_posterior={}, plot_ppc=dict(num_pp_samples=20, random_seed=0)
    ),
    1: dict(plot_trace_dist={}, plot_dist={}, plot_ppc_dist=dict(num_samples=20)),
}[diagnostics.arviz_major()]

GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731
TINY_FLOW = dict(transforms=2, hidden=16, blocks=1, bins=4)


@pytest.fixture(scope="module")
def task():
    return dpsbi.tasks.load("conjugate_gaussian")


@pytest.fixture(scope="module")
def sple(task):
    """A small SPLE posterior sampled by 20 chains (50 draws each for 1000 draws)."""
    estimator = dpsbi.SPLE(
        task,
        rounds=1,
        sims_per_round=500,
        progress=False,
        training=dict(max_steps=200),
        flow=TINY_FLOW,
        mcmc=dict(num_chains=20),
        seed=0,
    )
    return estimator.run()


@pytest.fixture(scope="module")
def sple_data(sple):
    return sple.to_arviz(1000, seed=0, predictive=True)


def ar1(phi: float, chains: int, length: int, seed: int = 0) -> np.ndarray:
    """Stationary AR(1) chains ``(chains, length)`` of unit variance."""
    rng = np.random.default_rng(seed)
    x = np.empty((chains, length))
    x[:, 0] = rng.standard_normal(chains)
    noise = rng.standard_normal((chains, length)) * math.sqrt(1 - phi**2)
    for t in range(1, length):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x


# ---- one ESS / R-hat: ArviZ's -----------------------------------------------------------------------------


def test_ess_and_rhat_are_arvizs_and_match_an_ar1_chain():
    """AR(1) with phi = 0.5: ESS = n (1 - phi) / (1 + phi) = n / 3. The estimator's relative error on 4 chains of
    5000 draws is a few percent; 15% is far outside it."""
    phi, x = 0.5, ar1(0.5, 4, 5000)
    chains = torch.as_tensor(np.stack([x, 2 * x + 1], -1))  # (C, T, 2)
    ess, tail, rhat = diagnostics.ess(chains), diagnostics.ess(chains, "tail"), diagnostics.rhat(chains)
    assert ess.shape == tail.shape == rhat.shape == (2,) and ess.dtype == torch.float64
    assert float(ess[0]) == pytest.approx(float(az.ess(x, method="bulk")), rel=1e-12)
    assert float(tail[0]) == pytest.approx(float(az.ess(x, method="tail", prob=(0.05, 0.95))), rel=1e-12)
    assert float(rhat[0]) == pytest.approx(float(az.rhat(x, method="rank")), rel=1e-12)
    assert torch.allclose(ess[0], ess[1]) and torch.allclose(rhat[0], rhat[1])  # rank-normalized: affine-free
    expected = x.size * (1 - phi) / (1 + phi)
    assert abs(float(ess[0]) / expected - 1) < 0.15, (float(ess[0]), expected)
    assert float(rhat[0]) < 1.01
    # The same numbers under ArviZ 0.23.4 and 1.3.0 (written down under the first).
    assert [float(ess[0]), float(tail[0]), float(rhat[0])] == pytest.approx(
        [6370.5309233906955, 11695.65295697113, 1.0003647273041647], rel=1e-9
    )
    assert float(diagnostics.ess(torch.as_tensor(x))) == pytest.approx(float(ess[0]))  # (C, T): a scalar
    found = diagnostics.chain_diagnostics(chains)
    assert set(found) == {"ess", "ess_tail", "rhat", "iat"}
    assert torch.allclose(found["iat"], x.size / ess)


def test_rhat_flags_chains_that_disagree_and_short_or_single_chains_give_nan():
    chains = torch.randn(8, 2000, 2, generator=GEN(0))
    assert ((diagnostics.rhat(chains) - 1).abs() < 0.01).all()
    assert (diagnostics.rhat(chains + torch.arange(8.0).reshape(8, 1, 1)) > 2).all()
    assert diagnostics.rhat(chains[:1]).isnan().all()  # R-hat compares chains
    assert diagnostics.ess(chains[:, :1000]).gt(0.8 * 8000).all()
    # 500 chains of 4 draws: ArviZ would return its bound n log10 n (6602 for 2000 draws) whatever the chains.
    assert diagnostics.ess(chains[:, :4]).isnan().all()
    one = diagnostics.summary(chains[:1])
    assert one["rhat"] is None and one["ess_bulk"] == pytest.approx(float(diagnostics.ess(chains[:1]).min()))


# ---- posteriors -------------------------------------------------------------------------------------------


def test_sple_keeps_its_chains_named_after_the_parameters(task, sple_data):
    posterior = sple_data.posterior
    assert list(posterior.data_vars) == task.parameter_names == ["theta_1", "theta_2"]
    assert dict(posterior.sizes) == {"chain": 20, "draw": 50}
    rhat, ess = az.rhat(sple_data), az.ess(sple_data)
    for name in task.parameter_names:
        assert math.isfinite(float(rhat[name])) and float(rhat[name]) < 1.1, float(rhat[name])
        assert float(ess[name]) > 200, float(ess[name])
    attrs = posterior.attrs
    assert attrs["method"] == "SPLE" and attrs["task"] == "conjugate_gaussian"
    assert attrs["epsilon"] == task.epsilon
    assert attrs["release"] == pytest.approx(task.y_obs.reshape(-1).tolist())
    settings = json.loads(attrs["settings"])
    assert settings["kind"] == "likelihood" and settings["mcmc"]["num_chains"] == 20
    assert attrs["sampler"] == "mcmc:elliptical_slice" and attrs["num_chains"] == 20
    assert np.allclose(sple_data.observed_data["release"].values, task.y_obs.reshape(-1).numpy())
    assert sple_data.posterior_predictive["release"].shape == (20, 50, task.dim_s)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ArviZ's plots on matplotlib >= 3.11
def test_arviz_functions_apply(sple_data, tmp_path):
    summary = az.summary(sple_data)
    assert list(summary.index) == ["theta_1", "theta_2"] and {"r_hat", "ess_bulk"} <= set(summary.columns)
    for name, options in PLOTS.items():  # the trace, the marginals, the posterior predictive check
        save_figure(getattr(az, name)(sple_data, **options), tmp_path / f"{name}.png")
    sple_data.to_netcdf(tmp_path / "posterior.nc")  # every attribute is netCDF-safe
    assert az.from_netcdf(tmp_path / "posterior.nc").posterior.attrs["method"] == "SPLE"


def save_figure(plot, path) -> None:
    """Save and close what an ArviZ plot returned: axes (ArviZ 0.x) or a ``PlotCollection`` (1.x)."""
    figure = plot.viz["figure"].item() if hasattr(plot, "viz") else np.ravel(plot)[0].figure
    assert any(axes.lines or axes.collections or axes.patches for axes in figure.axes)  # something drawn
    figure.savefig(path)
    matplotlib.pyplot.close(figure)
    assert path.read_bytes()[:4] == b"\x89PNG"


def groups(data) -> list[str]:
    """The group names of an ``InferenceData`` (ArviZ 0.x) or a ``DataTree`` (1.x)."""
    return sorted(data.groups() if KIND == "InferenceData" else data.children)


def check_layout(data, names: list[str], chains: int, draws: int, dim_s: int, attrs: dict) -> None:
    """The one layout of an export under either ArviZ major: a posterior variable ``(chain, draw)`` per name,
    the release ``(release_dim,)`` observed and ``(chain, draw, release_dim)`` predicted (what ArviZ's posterior
    predictive plots read), integer coordinates from 0, ``attrs`` on every group and on the whole."""
    assert type(data).__name__ == KIND
    assert groups(data) == ["observed_data", "posterior", "posterior_predictive"]
    posterior, observed, predicted = data["posterior"], data["observed_data"], data["posterior_predictive"]
    assert list(posterior.data_vars) == names
    assert all(posterior[name].dims == ("chain", "draw") for name in names)
    assert observed["release"].dims == ("release_dim",) and observed["release"].shape == (dim_s,)
    assert predicted["release"].dims == ("chain", "draw", "release_dim")
    assert predicted["release"].shape == (chains, draws, dim_s)
    for dim, size in dict(chain=chains, draw=draws, release_dim=dim_s).items():
        assert predicted[dim].values.tolist() == list(range(size))
    for where in (data, posterior, observed, predicted):
        # netCDF reads a list of one number back as the number
        assert {k: np.reshape(where.attrs[k], np.shape(v)).tolist() for k, v in attrs.items()} == attrs
        assert where.attrs["inference_library"] == "dpsbi"


@pytest.fixture(scope="module")
def exports(task, sple):
    """``name -> (export, parameter names, chains, draws, attributes)`` of a flow posterior, SPLE's likelihood
    posterior with its default MCMC settings (500 chains) and an MCMC baseline."""
    torch.manual_seed(0)
    flow = ConditionalFlow(FlowSettings(**TINY_FLOW), torch.randn(50, 2), torch.randn(50, 2))
    sppe = FlowPosterior(task, flow, "SPPE", amortized=True)
    default_sple = LikelihoodPosterior(task, sple.flow, "SPLE")
    counts = dpsbi.tasks.load("poisson_counts")
    result = pmmh(counts, 130, 20, 0.3, num_chains=3, burn_in=30, generator=GEN(1), progress=False)
    release = dict(task=task.name, epsilon=task.epsilon, release=task.y_obs.reshape(-1).tolist())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = {
            "flow": (sppe.to_arviz(300, seed=1, predictive=True), task.parameter_names, 1, 300, release),
            "sple": (
                default_sple.to_arviz(2000, seed=0, predictive=True),
                task.parameter_names,
                44,
                46,
                release,
            ),
            "pmmh": (
                result.to_arviz(counts, generator=GEN(2), predictive=True),
                ["theta"],
                3,
                100,
                dict(task=counts.name, method="PMMH", release=counts.y_obs.reshape(-1).tolist()),
            ),
        }
    # ArviZ 0.x warns "More chains (500) than draws (4)", ArviZ 1.x "Found chain dimension to be longer ..."
    assert not [str(w.message) for w in caught if "chain" in str(w.message)]
    return found


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ArviZ's plots on matplotlib >= 3.11
@pytest.mark.filterwarnings("ignore:Your data appears to have a single value")  # 0.x: KDE of 1 observed value
@pytest.mark.parametrize("name", ["flow", "sple", "pmmh"])
def test_exports_have_one_layout_under_either_arviz_major_and_survive_netcdf(exports, name, tmp_path):
    data, names, chains, draws, attrs = exports[name]
    dim_s = len(attrs["release"])
    check_layout(data, names, chains, draws, dim_s, attrs)
    data.to_netcdf(tmp_path / "export.nc")
    back = az.from_netcdf(tmp_path / "export.nc")
    check_layout(back, names, chains, draws, dim_s, attrs)
    for group in groups(data):
        for variable in data[group].data_vars:
            assert np.array_equal(back[group][variable].values, data[group][variable].values)
    save_figure(
        az.plot_ppc(back) if KIND == "InferenceData" else az.plot_ppc_dist(back), tmp_path / "ppc.png"
    )


def test_sple_exports_no_more_chains_than_draws(task, exports):
    """SPLE samples 2000 draws as 4 from each of 500 chains; its export runs 44 chains of 46 draws, which
    ArviZ takes without a warning (fixture). Their R-hat read 1.000-1.016 at seeds 0-2 (bulk ESS ~2100 of
    2024 draws), where the 500 chains of 4 read 1.03-1.07 on this posterior."""
    data = exports["sple"][0]
    assert (
        data["posterior"].attrs["num_chains"] == 44
        and data["posterior"].attrs["sampler"] == "mcmc:elliptical_slice"
    )
    assert json.loads(data["posterior"].attrs["settings"])["mcmc"]["num_chains"] == 500  # the posterior's own
    rhat = az.rhat(data)
    for name in task.parameter_names:
        assert float(rhat[name]) < 1.03, float(rhat[name])
    assert diagnostics.export_chains(4000, 500) == 63 and diagnostics.export_chains(1000, 20) == 20
    assert diagnostics.export_chains(3, 500) == 1


def test_sample_chains_are_the_chains_behind_sample(sple):
    draws = sple.sample((130,), seed=4)
    chains = sple.sample_chains(130, seed=4)
    assert chains.shape == (20, 7, 2)
    assert torch.equal(chains.transpose(0, 1).reshape(-1, 2)[:130], draws)
    assert torch.equal(sple.sample_chains(400, seed=4)[:, :7], chains)  # a longer run continues the chains


def test_a_flow_posterior_is_one_chain_of_independent_draws(task):
    torch.manual_seed(0)
    flow = ConditionalFlow(FlowSettings(**TINY_FLOW), torch.randn(50, 2), torch.randn(50, 2))
    posterior = FlowPosterior(task, flow, "SPPE", amortized=True)
    data = posterior.to_arviz(300, seed=1)
    assert dict(data.posterior.sizes) == {"chain": 1, "draw": 300}
    draws = posterior.sample((300,), seed=1)
    assert np.allclose(data.posterior["theta_2"].values[0], draws[:, 1].numpy())
    assert data.posterior.attrs["sampler"] == "flow" and data.posterior.attrs["method"] == "SPPE"
    for count in (0, 2.5):  # no draws (an empty export with ArviZ's warnings), or a count that is not whole
        with pytest.raises(ValueError, match=rf"^num_samples must be an integer >= 1, got {count}$"):
            posterior.to_arviz(count)


# ---- baselines -----------------------------------------------------------------------------------------


def test_an_mcmc_baseline_keeps_its_chains():
    task = dpsbi.tasks.load("poisson_counts")
    result = pmmh(task, 400, 20, 0.3, num_chains=4, burn_in=100, generator=GEN(1), progress=False)
    data = result.to_arviz(task)
    assert list(data.posterior.data_vars) == ["theta"] and dict(data.posterior.sizes) == {
        "chain": 4,
        "draw": 300,
    }
    assert torch.equal(
        torch.as_tensor(data.posterior["theta"].values), result.info["chains"][..., 0].double()
    )
    attrs = data.posterior.attrs
    assert attrs["method"] == "PMMH" and attrs["epsilon"] == task.epsilon and attrs["sampler"] == "mcmc"
    assert attrs["num_simulations"] == result.num_simulations
    assert json.loads(attrs["settings"])["num_particles"] == 20
    # The result's own diagnostics are ArviZ's, on the same chains.
    assert float(result.info["rhat"][0]) == pytest.approx(float(az.rhat(data)["theta"]))
    assert float(result.info["ess"][0]) == pytest.approx(float(az.ess(data)["theta"]))
    assert float(result.info["iat"][0]) == pytest.approx(1200 / float(result.info["ess"][0]))


def test_weighted_abc_draws_are_resampled_into_one_chain():
    task = dpsbi.tasks.load("poisson_counts")
    result = abc_is(task, 3000, seed=0, progress=False)
    data = result.to_arviz(task, num_samples=500, generator=GEN(2), predictive=True)
    assert dict(data.posterior.sizes) == {"chain": 1, "draw": 500}
    drawn = torch.as_tensor(data.posterior["theta"].values[0])
    assert torch.isin(drawn, result.samples[:, 0].double()).all()  # resampled from the weighted draws
    assert data.posterior.attrs["kish_ess"] == pytest.approx(result.ess)
    assert data.posterior_predictive["release"].shape == (1, 500, 1)
    unnamed = result.to_arviz(num_samples=10)  # without the task: generic names, no release
    assert list(unnamed.posterior.data_vars) == ["theta[0]"] and "release" not in unnamed.posterior.attrs


# ---- the run's summary ---------------------------------------------------------------------------------


def test_run_summary_reports_rhat_and_ess_of_sple_and_mcmc_baselines(tmp_path, capsys):
    cache = f"reference.cache_dir={tmp_path / 'cache'}"
    sple_run = [
        "method=sple",
        "task=poisson_counts",
        "method.rounds=1",
        "method.sims_per_round=100",
        "method.inner_samples=4",
        "method.mcmc={num_chains: 10, warmup: 10, thin: 1, init_candidates: 100}",
        *NEURAL,
    ]
    (row,) = run_experiment(config(*sple_run, *QUICK, cache), tmp_path / "sple")
    assert 0.9 < row["rhat"] < 1.2 and row["ess_bulk"] > 10, row
    table = capsys.readouterr().out
    assert "rhat" in table.splitlines()[1] and "ess_bulk" in table.splitlines()[1]
    pmmh_run = ["method=pmmh", "task=poisson_counts", "method.num_iterations=200", "method.num_particles=20"]
    (row,) = run_experiment(config(*pmmh_run, *QUICK, cache), tmp_path / "pmmh")
    assert math.isfinite(row["rhat"]) and row["ess_bulk"] > 0
    assert "rhat" in format_table([row]).splitlines()[0]


def test_chain_summary_is_empty_without_chains(task):
    result = abc_is(task, 500, seed=0, progress=False)
    assert methods.chain_summary(result, 100, 0) == {}


# ---- posterior predictive check ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["conjugate_gaussian", "uniform_mixture"])
def test_ppc_plot_draws_simulated_releases_against_the_observed_one(name, tmp_path):
    """A 2-coordinate release (a histogram per coordinate) and a 20-coordinate one (intervals in one panel)."""
    task = dpsbi.tasks.load(name)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        draws = task.prior.sample((200,))
    path = tmp_path / "ppc.png"
    tails = ppc_plot(task, {"prior": draws, "half": draws[:100]}, path, num_releases=150, generator=GEN(3))
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"
    assert set(tails) == {"prior", "half"}
    assert tails["prior"].shape == (task.dim_s,) and ((tails["prior"] >= 0) & (tails["prior"] <= 1)).all()
