"""Posterior objects: densities in the prior's space, release validation, the save/load file format, and the
sbi-style interface (set_default_x, sample_batched, log_prob_batched, map)."""

import dataclasses
import json
import math
import pickle
import re
import warnings

import pytest
import torch

import dpsbi
import dpsbi.inference.posterior as posterior_module
from dpsbi.files import load_sealed, save_sealed
from dpsbi.inference import ConditionalFlow, FlowPosterior, FlowSettings, LikelihoodPosterior, load_posterior
from dpsbi.mechanisms import Laplace

TINY = dict(flow=dict(transforms=1, hidden=8), training=dict(max_epochs=2), progress=False)
#: Three releases of the conjugate toy (B = 3) for the batched calls.
RELEASES = torch.tensor([[0.0, 0.0], [2.0, -1.0], [-2.0, 1.5]])


@pytest.fixture(scope="module")
def task():
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)


@pytest.fixture(scope="module")
def posteriors(task):
    sppe = dpsbi.SPPE(task, rounds=1, sims_per_round=100, inner_samples=4, **TINY).run()
    sple = dpsbi.SPLE(
        task, rounds=1, sims_per_round=100, inner_samples=4, mcmc=dict(num_chains=10, warmup=5), **TINY
    ).run()
    return {"sppe": sppe, "sple": sple}


def _random_flow_posterior(task, cls=FlowPosterior, backend="dpsbi", **kwargs):
    """A posterior on an untrained flow (of ``backend``'s layers) whose weights are perturbed away from the
    identity."""
    torch.manual_seed(0)
    theta = task.prior.sample((50,))
    z = task.transform.inv(theta)
    inputs, context = (
        (z, task.release(task.simulate(theta)))
        if cls is FlowPosterior
        else (task.release(task.simulate(theta)), z)
    )
    flow = ConditionalFlow(FlowSettings(transforms=2, hidden=8, backend=backend), inputs, context)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn(p.shape))
    return cls(task, flow, "SPPE", **kwargs)


def test_flow_posterior_density_integrates_to_one_in_the_constrained_space():
    """Poisson counts: theta = exp(z), so the density in theta must carry the log-det; it integrates to 1
    over theta > 0 and its samples have the mean that the density gives."""
    task = dpsbi.tasks.load("poisson_counts")
    post = _random_flow_posterior(task, amortized=True)
    grid = torch.linspace(1e-3, 300.0, 300_001).unsqueeze(-1)
    density = post.log_prob(grid).double().exp()
    step = float(grid[1, 0] - grid[0, 0])
    assert float(density.sum() * step) == pytest.approx(1.0, abs=2e-3)
    draws = post.sample((20_000,), seed=0).double()
    mean = float((grid[:, 0].double() * density).sum() * step)
    assert abs(float(draws.mean()) - mean) < 4 * float(draws.std()) / math.sqrt(20_000)
    assert post.log_prob(torch.tensor([[-1.0]])).item() == -math.inf  # outside the prior's support


@pytest.mark.parametrize("kind", ["sppe", "sple"])
def test_saved_posteriors_load_with_the_same_samples_and_densities(posteriors, tmp_path, kind):
    post = posteriors[kind]
    path = tmp_path / f"{kind}.pt"
    post.save(path)
    loaded = load_posterior(path, device=post.device)
    assert type(loaded) is type(post) and loaded.method == post.method
    assert torch.equal(loaded.sample((100,), seed=3), post.sample((100,), seed=3))
    theta = post.sample((20,), seed=4)
    assert torch.allclose(loaded.log_prob(theta), post.log_prob(theta))
    y = post.task.y_obs + 0.5
    assert torch.allclose(loaded.log_prob(theta, y=y), post.log_prob(theta, y=y))
    assert torch.equal(loaded.task.y_obs, post.task.y_obs)


def test_samples_depend_on_the_seed_only(posteriors):
    post = posteriors["sppe"]
    assert torch.equal(
        post.sample((10,), seed=1), post.sample((10,), generator=torch.Generator().manual_seed(1))
    )
    assert not torch.equal(post.sample((10,), seed=1), post.sample((10,), seed=2))
    assert post.sample((4, 5), seed=1).shape == (4, 5, 2) and post.log_prob(torch.zeros(4, 5, 2)).shape == (
        4,
        5,
    )


def test_likelihood_posterior_log_prob_is_prior_times_likelihood_flow(posteriors, task):
    post = posteriors["sple"]
    theta = torch.randn(7, 2)
    likelihood = post.flow.log_prob(
        task.y_obs.to(post.device), theta.to(post.device)
    )  # the flow's own device
    expected = task.prior.log_prob(theta) + likelihood.cpu()
    assert torch.allclose(post.log_prob(theta).cpu(), expected)


def test_a_posterior_of_a_hand_built_task_loads_only_with_the_task(tmp_path, task):
    bare = dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)
    bare.spec = None  # as if built without dpsbi.tasks.load
    post = _random_flow_posterior(bare, amortized=True)
    post.save(tmp_path / "p.pt")
    with pytest.raises(ValueError, match="pass task="):
        load_posterior(tmp_path / "p.pt")
    assert torch.equal(
        load_posterior(tmp_path / "p.pt", task=task).sample((3,), seed=0), post.sample((3,), seed=0)
    )


def test_loading_with_a_task_leaves_the_task_as_it_was(tmp_path, task):
    """The loaded posterior holds the file's release; the task passed in keeps its own (it was overwritten in
    place), with a warning where the two differ, and none where they agree."""
    post = _random_flow_posterior(task, amortized=False)
    post.save(tmp_path / "p.pt")
    other = dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0, y_obs=[0.25, -0.5])
    before = other.y_obs.clone()
    with pytest.warns(
        UserWarning,
        match=r"trained at the release y_obs = \[1.78947, 0.377871\], not the given task.s \[0.25, -0.5\]",
    ):
        loaded = load_posterior(tmp_path / "p.pt", task=other)
    assert torch.equal(other.y_obs, before) and loaded.task is not other
    assert torch.equal(loaded.task.y_obs, task.y_obs) and loaded.task.s_obs is None
    assert torch.equal(loaded.sample((3,), seed=0), post.sample((3,), seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(load_posterior(tmp_path / "p.pt", task=task).task.y_obs, task.y_obs)


class Payload:
    """An arbitrary object: loading its pickle would run code of the file's choosing."""


@pytest.mark.parametrize(
    "write, match",
    [
        (lambda p: torch.save({"weights": torch.ones(3)}, p), "not a dpsbi posterior"),
        (lambda p: torch.save(Payload(), p), "not a readable dpsbi posterior"),
        (lambda p: p.write_bytes(pickle.dumps(Payload())), "not a readable dpsbi posterior"),
        (lambda p: p.write_bytes(b"\x00garbage" * 100), "not a readable dpsbi posterior"),
    ],
)
def test_foreign_or_corrupted_files_are_refused(tmp_path, write, match):
    path = tmp_path / "bad.pt"
    write(path)
    with pytest.raises(ValueError, match=match):
        load_posterior(path)


def test_truncated_or_tampered_posterior_files_are_refused(posteriors, tmp_path):
    path = tmp_path / "p.pt"
    posteriors["sppe"].save(path)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable"):
        load_posterior(tmp_path / "cut.pt")
    payload = load_sealed(path, "posterior")
    payload["state_dict"].popitem()
    torch.save(payload, tmp_path / "edited.pt")  # edited without a checksum
    with pytest.raises(ValueError, match="no checksum"):
        load_posterior(tmp_path / "edited.pt")
    save_sealed(payload, tmp_path / "resealed.pt")  # edited and sealed again
    with pytest.raises(ValueError, match="do not fit"):
        load_posterior(tmp_path / "resealed.pt")
    with pytest.raises(FileNotFoundError):
        load_posterior(tmp_path / "missing.pt")


@pytest.mark.parametrize("version, write", [(1, torch.save), (3, save_sealed)])
def test_posterior_files_of_another_format_version_are_refused(task, tmp_path, version, write):
    path = tmp_path / "p.pt"
    _random_flow_posterior(task, amortized=True).save(path)
    payload = load_sealed(path, "posterior")
    write({**payload, "version": version}, path)  # version 1 files carried no checksum
    with pytest.raises(
        ValueError, match=rf"{re.escape(str(path))}.*format version {version}.*reads version 2"
    ):
        load_posterior(path)


def test_posterior_files_with_weights_that_are_not_finite_are_refused(task, tmp_path):
    post = _random_flow_posterior(task, amortized=True)
    name, weight = next(iter(post.flow.named_parameters()))
    with torch.no_grad():
        weight.view(-1)[0] = math.nan
    post.save(tmp_path / "p.pt")
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path / 'p.pt'))}.*{re.escape(name)}.*NaN"):
        load_posterior(tmp_path / "p.pt")


def test_draws_that_are_not_finite_are_never_returned(task, monkeypatch):
    post = _random_flow_posterior(task, amortized=True)
    shift = next(
        value for key, value in post.flow.state_dict().items() if key.endswith(("_shift", "spline.mean"))
    )
    shift[0] = math.nan  # the flow's output shift (its z-scoring): every draw gets a NaN coordinate
    with pytest.raises(
        RuntimeError, match="SPPE posterior of task 'conjugate_gaussian': 5 of 5 draws are NaN/inf"
    ):
        post.sample((5,), seed=0)
    likelihood = _random_flow_posterior(
        task, LikelihoodPosterior, mcmc=dict(num_chains=2, warmup=0, init_candidates=10)
    )
    monkeypatch.setattr(
        posterior_module,
        "slice_sample_groups",
        lambda *args, **kwargs: torch.tensor(
            [[[0.0, 0.0]], [[math.inf, 0.0]], [[0.0, 1.0]]]
        ),  # (n, 1 release, d)
    )
    with pytest.raises(
        RuntimeError, match="SPPE posterior of task 'conjugate_gaussian': 1 of 3 draws are NaN/inf"
    ):
        likelihood.sample((3,), seed=0)


def test_a_posterior_file_is_refused_for_another_model(tmp_path):
    """Saved at epsilon 1: refused with the task at epsilon 10, and with a hand-built task whose mechanism
    differs; every differing field is named with both values."""
    at_1 = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    path = tmp_path / "p.pt"
    post = _random_flow_posterior(at_1, amortized=True)
    post.save(path)
    with pytest.raises(ValueError, match=re.escape(str(path))) as refused:
        load_posterior(path, task=dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0))
    assert "epsilon: 1.0 vs 10.0" in str(refused.value) and "mechanism.epsilon: 1.0 vs 10.0" in str(
        refused.value
    )
    assert "mechanism.sigma" in str(refused.value)
    laplace = dataclasses.replace(at_1, mechanism=Laplace(1.0, 1.0, dim=2), spec=None)
    with pytest.raises(ValueError, match="mechanism.type: 'Gaussian' vs 'Laplace'"):
        load_posterior(path, task=laplace)
    same = load_posterior(path, task=dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0))
    assert torch.equal(same.sample((3,), seed=0), post.sample((3,), seed=0))


def test_a_posterior_file_is_refused_for_a_task_with_another_simulator(task, tmp_path):
    """Same name, prior and mechanism, the simulator shifted: refused as checkpoints refuse it (the file
    records two parameters and their summaries under a fixed seed); the same simulator loads."""
    path = tmp_path / "p.pt"
    _random_flow_posterior(task, amortized=True).save(path)
    shifted = dataclasses.replace(
        task, simulator=lambda theta, generator=None: task.simulator(theta, generator) + 1.0
    )
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(path))} was simulated by another simulator: .*load it with the task",
    ):
        load_posterior(path, task=shifted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_posterior(path, task=task)


def test_a_simulator_that_ignores_its_seed_loads_with_a_warning(task, tmp_path):
    noisy = dataclasses.replace(
        task, simulator=lambda theta, generator=None: theta + torch.randn(theta.shape)
    )
    path = tmp_path / "p.pt"
    _random_flow_posterior(noisy, amortized=True).save(path)
    with pytest.warns(
        UserWarning, match=r"does not reproduce its output .* cannot check that .*p\.pt was simulated by it"
    ):
        load_posterior(path, task=noisy)


def test_a_posterior_file_written_before_simulator_probes_loads_with_a_warning(task, tmp_path):
    path = tmp_path / "p.pt"
    post = _random_flow_posterior(task, amortized=True)
    post.save(path)
    payload = load_sealed(path, "test file")
    meta = json.loads(payload["meta"])
    del meta["simulator"]
    save_sealed({**payload, "meta": json.dumps(meta)}, path)
    with pytest.warns(UserWarning, match=r"written before posterior files recorded the simulator") as caught:
        loaded = load_posterior(path)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert torch.equal(loaded.sample((3,), seed=0), post.sample((3,), seed=0))


def test_a_changed_registered_task_definition_is_caught(task, tmp_path, monkeypatch):
    path = tmp_path / "p.pt"
    _random_flow_posterior(task, amortized=True).save(path)
    make = dpsbi.tasks._REGISTRY["conjugate_gaussian"]
    monkeypatch.setitem(
        dpsbi.tasks._REGISTRY, "conjugate_gaussian", lambda **kwargs: make(**kwargs, sensitivity=2.0)
    )
    with pytest.raises(ValueError, match=r"mechanism.sensitivity: 1.0 vs 2.0"):
        load_posterior(path)


def _flow_batch_sizes(flow: ConditionalFlow, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of rows of every ``flow.sample_and_log_prob`` (which ``flow.sample`` calls) /
    ``flow.log_prob`` call."""
    sizes: list[int] = []
    for name in ("sample_and_log_prob", "log_prob"):
        method = getattr(flow, name)

        def spy(x, context, method=method):
            sizes.append(torch.broadcast_shapes(x.shape[:-1], context.shape[:-1]).numel())
            return method(x, context)

        monkeypatch.setattr(flow, name, spy)
    return sizes


@pytest.mark.parametrize("cls", [FlowPosterior, LikelihoodPosterior])
def test_sampling_and_densities_in_chunks_match_one_call(task, monkeypatch, cls):
    """Chunks of at most CHUNK_ROWS rows per flow call; the same base noise, so the same draws and densities
    (up to float32 round-off: matrix products round differently with the number of rows)."""
    post = _random_flow_posterior(task, cls, **({"amortized": True} if cls is FlowPosterior else {}))
    theta = torch.randn(5, 10, 2, generator=torch.Generator().manual_seed(1))
    whole = (
        (post.sample((5, 10), seed=3), post.sample_batched((5, 4), RELEASES, seed=3))
        if cls is FlowPosterior
        else None
    )
    whole_log_prob = post.log_prob(theta), post.log_prob_batched(theta[:, :3], RELEASES)
    sizes = _flow_batch_sizes(post.flow, monkeypatch)
    monkeypatch.setattr(posterior_module, "CHUNK_ROWS", 7)
    if cls is FlowPosterior:  # the likelihood posterior's MCMC calls the flow with num_chains rows
        assert torch.allclose(post.sample((5, 10), seed=3), whole[0], rtol=1e-5, atol=1e-5)
        assert torch.allclose(post.sample_batched((5, 4), RELEASES, seed=3), whole[1], rtol=1e-5, atol=1e-5)
    assert torch.allclose(post.log_prob(theta), whole_log_prob[0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(
        post.log_prob_batched(theta[:, :3], RELEASES), whole_log_prob[1], rtol=1e-5, atol=1e-5
    )
    assert sizes and max(sizes) <= 7


@pytest.mark.parametrize("kind", ["sppe", "sple"])
def test_releases_of_the_wrong_shape_are_refused(posteriors, kind):
    post = posteriors[kind]
    with pytest.raises(ValueError, match="shape"):
        post.sample((5,), y=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="one release"):
        post.sample((5,), y=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="holds inf"):
        post.log_prob(torch.zeros(1, 2), y=torch.tensor([[0.0, math.inf]]))
    with pytest.raises(ValueError, match="theta"):
        post.log_prob(torch.zeros(3, 5))


def test_releases_outside_the_mechanism_support_are_refused():
    """The binomial curve mechanism releases multiples of 1/N in [0, 1]."""
    task = dpsbi.tasks.load("sir", epsilon=10.0)
    post = FlowPosterior(
        task, ConditionalFlow.blank(FlowSettings(transforms=1, hidden=4), 2, 10), "SPPE", amortized=True
    )
    with pytest.raises(ValueError, match="outside the support"):
        post.sample((2,), y=torch.full((1, 10), 0.0015))
    with pytest.raises(ValueError, match="outside the support"):
        post.sample((2,), y=torch.full((1, 10), 1.5))
    assert post.sample((2,), y=task.y_obs, seed=0).shape == (2, 2)
    likelihood = LikelihoodPosterior(
        task, ConditionalFlow.blank(FlowSettings(transforms=1, hidden=4), 10, 2), "SPLE"
    )
    assert likelihood.log_prob(task.prior.mean.expand(3, 2)).shape == (3,)  # at task.y_obs
    with pytest.raises(ValueError, match="outside the support"):
        likelihood.log_prob(task.prior.mean.expand(3, 2), y=torch.full((1, 10), 0.0015))


# ---- the sbi-style interface: default release, batched sampling and densities, MAP ------------------------------


def test_set_default_x_is_validated_used_and_saved(task, tmp_path):
    post = _random_flow_posterior(task, amortized=True)
    assert torch.equal(post.default_x, task.y_obs)
    y = task.y_obs + 1.0
    assert post.set_default_x(y) is post and torch.equal(post.default_x, y)
    theta = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(post.sample((5,), seed=0), post.sample((5,), y=y, seed=0))
    assert torch.equal(post.log_prob(theta), post.log_prob(theta, y=y))
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        post.set_default_x(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="one release"):
        post.set_default_x(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="holds NaN"):
        post.set_default_x(torch.tensor([math.nan, 0.0]))
    post.save(tmp_path / "p.pt")
    loaded = load_posterior(tmp_path / "p.pt")
    assert torch.equal(loaded.default_x, y) and torch.equal(
        loaded.sample((5,), seed=0), post.sample((5,), seed=0)
    )


def test_without_any_release_the_posterior_asks_for_one(task):
    post = _random_flow_posterior(dataclasses.replace(task, y_obs=None), amortized=True)
    with pytest.raises(ValueError, match="has no observed release; pass y= or call set_default_x"):
        post.sample((2,))
    assert post.set_default_x(torch.zeros(2)).sample((3,), seed=0).shape == (3, 2)


def test_sample_batched_is_one_flow_call_with_the_draws_of_sample(task, monkeypatch):
    """Shape ``sample_shape + (B, d)`` in one flow call; with one release exactly the draws of ``sample``; with
    several, column ``b`` has the distribution of ``sample`` at release ``b`` (means within 4 Monte Carlo
    standard errors) and independent noise across columns."""
    post = _random_flow_posterior(task, amortized=True)
    n = 4000
    sizes = _flow_batch_sizes(post.flow, monkeypatch)
    draws = post.sample_batched((n,), RELEASES, seed=0)
    assert draws.shape == (n, 3, 2) and sizes == [3 * n]
    assert post.sample_batched((2, 5), RELEASES, seed=0).shape == (2, 5, 3, 2)
    assert torch.equal(
        post.sample_batched((7,), RELEASES[:1], seed=1)[:, 0], post.sample((7,), y=RELEASES[:1], seed=1)
    )
    for b in range(3):
        single = post.sample((n,), y=RELEASES[b : b + 1], seed=10 + b)
        se = ((draws[:, b].var(0) + single.var(0)) / n).sqrt()
        assert ((draws[:, b].mean(0) - single.mean(0)).abs() < 4 * se).all(), (
            b,
            draws[:, b].mean(0),
            single.mean(0),
            se,
        )
    same = post.sample_batched((10,), RELEASES[[0, 0]], seed=2)
    assert not torch.allclose(same[:, 0], same[:, 1])


def test_sample_batched_of_a_likelihood_posterior_runs_every_release_in_one_chain_set(
    posteriors, monkeypatch
):
    """All releases' chains in one run (each density call holds every release's rows), column ``b`` drawn at
    release ``b`` (its mean is nearest to ``sample``'s at ``b`` among the releases'); with one release exactly
    the draws of ``sample``."""
    post = posteriors["sple"]
    calls = []
    density = post.log_density_z
    monkeypatch.setattr(post, "log_density_z", lambda z, y: calls.append(z.shape[:-1]) or density(z, y))
    draws = post.sample_batched((400,), RELEASES, seed=0)
    assert draws.shape == (400, 3, 2) and torch.isfinite(draws).all()
    batched = len(calls)
    post.sample((400,), y=RELEASES[:1], seed=0)
    assert batched <= 2 * (len(calls) - batched), (batched, len(calls) - batched)
    singles = torch.stack([post.sample((400,), y=RELEASES[b : b + 1], seed=5 + b).mean(0) for b in range(3)])
    nearest = torch.cdist(draws.mean(0), singles).argmin(1)
    assert nearest.tolist() == [0, 1, 2], (draws.mean(0), singles)
    assert torch.equal(
        post.sample_batched((20,), RELEASES[:1], seed=3)[:, 0], post.sample((20,), y=RELEASES[:1], seed=3)
    )


@pytest.mark.parametrize("kind", ["sppe", "sple"])
def test_log_prob_batched_equals_log_prob_release_by_release(posteriors, kind):
    post = posteriors[kind]
    theta = torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(0))
    batched = post.log_prob_batched(theta, RELEASES)
    looped = torch.stack([post.log_prob(theta[:, b], y=RELEASES[b : b + 1]) for b in range(3)], dim=1)
    assert batched.shape == (6, 3) and torch.allclose(batched, looped, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"theta must have shape \(\.\.\., 3, 2\) for 3 releases"):
        post.log_prob_batched(torch.zeros(6, 2), RELEASES)


def test_batched_calls_on_a_sequential_posterior_warn_once(task):
    post = _random_flow_posterior(task, amortized=False)
    with pytest.warns(UserWarning, match="sequentially") as caught:
        post.sample_batched((3,), RELEASES, seed=0)
    ours = [w for w in caught if "sequentially" in str(w.message)]  # not the libraries' (nflows' on CUDA)
    assert len(ours) == 1 and ours[0].filename == __file__  # it points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        post.sample_batched((3,), task.y_obs.expand(2, -1), seed=0)  # at y_obs only: no warning


@pytest.mark.parametrize("kind", ["sppe", "sple"])
def test_map_finds_the_trained_posteriors_own_mode(posteriors, task, kind):
    """The conjugate toy's exact posterior N(m, s^2 I) fixes the search box (m +- 4 s); the trained posterior's
    own mode, by a grid search of its log density there, is where map lands, and no grid point is higher."""
    post = posteriors[kind]
    mode = post.map(num_init=200, num_to_optimize=10, steps=100, lr=0.05, seed=0)
    exact = task.exact_posterior(task.y_obs)
    axis = torch.linspace(-4.0, 4.0, 161) * float(exact.covariance_matrix[0, 0].sqrt())
    grid = torch.stack(torch.meshgrid(exact.mean[0] + axis, exact.mean[1] + axis, indexing="ij"), -1).reshape(
        -1, 2
    )
    values, mode = post.log_prob(grid).cpu(), mode.cpu()  # results live on the flow's device
    assert mode.shape == (2,)
    assert (mode - grid[values.argmax()]).norm() < 2 * float(axis[1] - axis[0])
    assert post.log_prob(mode[None]).item() >= values.max().item() - 1e-4
    quick = dict(num_init=50, num_to_optimize=2, steps=3, seed=1)
    assert torch.equal(post.map(**quick), post.map(**quick))  # seeded


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda post: post.sample((-5,)),
            r"sample_shape must be a tuple of integers >= 0, e\.g\. \(2000,\), got \(-5,\)",
        ),
        (lambda post: post.sample((2.5,)), r"sample_shape must be .*got \(2\.5,\)"),
        (lambda post: post.sample_batched((-1,), y=RELEASES), r"sample_shape must be .*got \(-1,\)"),
        (lambda post: post.sample((3,), seed=-1), r"seed must be an integer from 0 to 2\*\*63 - 1, got -1"),
        (
            lambda post: post.log_prob(torch.tensor([[0.0, 0.0], [math.nan, 0.0]])),
            r"theta holds NaN at index \[1\]",
        ),
    ],
    ids=["negative-shape", "float-shape", "batched-shape", "negative-seed", "nan-theta"],
)
def test_bad_arguments_of_a_posterior_are_refused_in_one_line(task, call, match):
    """Raw torch errors (and log_prob -inf for a NaN parameter, which sbi also returns) before."""
    with pytest.raises(ValueError, match=match) as refused:
        call(_random_flow_posterior(task, amortized=False))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("backend", ["dpsbi", "nflows"])
@pytest.mark.parametrize("task_name", ["conjugate_gaussian", "poisson_counts", "naive_bayes"])
def test_sample_and_log_prob_gives_samples_draws_and_their_log_prob(task_name, backend):
    """The draws of ``sample`` under the same seed, bit for bit, and ``log_prob``'s densities at them to float32
    rounding (Poisson counts: through ``theta = exp(z)``'s log-determinant; naive Bayes: through stick-breaking), in
    any sample shape."""
    post = _random_flow_posterior(dpsbi.tasks.load(task_name), backend=backend, amortized=True)
    theta, log_q = post.sample_and_log_prob((40, 50), seed=3)
    assert torch.equal(theta, post.sample((40, 50), seed=3))
    assert log_q.shape == (40, 50) and torch.allclose(log_q, post.log_prob(theta), rtol=0, atol=1e-4)
    empty = post.sample_and_log_prob((0, 2))
    assert empty[0].shape == (0, 2, post.task.dim_theta) and empty[1].shape == (0, 2)


def test_sample_and_log_prob_is_log_probs_own_where_float32_moves_a_draw():
    """A flow spread ten times wider puts naive Bayes' draws so near a simplex's edge that rounding theta to float32
    moves its unconstrained point (the densities from the drawing pass were up to 57 nats off ``log_prob``'s)."""
    post = _random_flow_posterior(dpsbi.tasks.load("naive_bayes"), amortized=True)
    with torch.no_grad():
        post.flow.spline.std.mul_(10)
    theta, log_q = post.sample_and_log_prob((2000,), seed=0)
    assert torch.allclose(log_q, post.log_prob(theta), rtol=0, atol=1e-3)


def test_a_sample_shape_may_be_one_integer_or_hold_a_zero(task):
    post = _random_flow_posterior(task, amortized=False)
    assert torch.equal(post.sample(3, seed=0), post.sample((3,), seed=0))
    assert post.sample((0,)).shape == (0, 2) and post.sample_batched((2, 0), y=RELEASES).shape == (2, 0, 3, 2)


def test_an_epsilon_that_is_not_a_number_is_a_type_error_naming_it(task):
    with pytest.raises(TypeError, match=r"epsilon must be a number or a tensor of numbers, got '1' \(str\)"):
        _random_flow_posterior(task, amortized=False).sample((3,), epsilon="1")
    for name in (
        "conjugate_gaussian",
        "census_table",
        "regression",
    ):  # census_table accepted it, others failed in arithmetic
        with pytest.raises(TypeError, match=rf"task '{name}': epsilon must be a number, got '1' \(str\)"):
            dpsbi.tasks.load(name, epsilon="1")
