"""Posterior objects: densities in the prior's space, release validation, and the save/load file format."""

import math
import pickle

import pytest
import torch

import dpsbi
from dpsbi.inference import ConditionalFlow, FlowConfig, FlowPosterior, LikelihoodPosterior, load_posterior
from test_inference_losses import one_thread  # noqa: F401  (autouse fixture: one torch thread)

TINY = dict(flow=dict(transforms=1, hidden=8), max_epochs=2, progress=False)


@pytest.fixture(scope="module")
def task():
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)


@pytest.fixture(scope="module")
def posteriors(task):
    sppe = dpsbi.SPPE(task, rounds=1, sims_per_round=100, inner_samples=4, **TINY).run()
    sple = dpsbi.SPLE(task, rounds=1, sims_per_round=100, inner_samples=4, mcmc=dict(num_chains=10, warmup=5), **TINY).run()
    return {"sppe": sppe, "sple": sple}


def _random_flow_posterior(task, cls=FlowPosterior, **kwargs):
    """A posterior on an untrained flow whose weights are perturbed away from the identity."""
    torch.manual_seed(0)
    theta = task.prior.sample((50,))
    z = task.transform.inv(theta)
    inputs, context = (z, task.release(task.simulate(theta))) if cls is FlowPosterior else (task.release(task.simulate(theta)), z)
    flow = ConditionalFlow(FlowConfig(transforms=2, hidden=8), inputs, context)
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
    assert torch.equal(post.sample((10,), seed=1), post.sample((10,), generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(post.sample((10,), seed=1), post.sample((10,), seed=2))
    assert post.sample((4, 5), seed=1).shape == (4, 5, 2) and post.log_prob(torch.zeros(4, 5, 2)).shape == (4, 5)


def test_likelihood_posterior_log_prob_is_prior_times_likelihood_flow(posteriors, task):
    post = posteriors["sple"]
    theta = torch.randn(7, 2)
    expected = task.prior.log_prob(theta) + post.flow.log_prob(task.y_obs, theta)
    assert torch.allclose(post.log_prob(theta), expected)


def test_a_posterior_of_a_hand_built_task_loads_only_with_the_task(tmp_path, task):
    bare = dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)
    bare.spec = None  # as if built without dpsbi.tasks.load
    post = _random_flow_posterior(bare, amortized=True)
    post.save(tmp_path / "p.pt")
    with pytest.raises(ValueError, match="pass task="):
        load_posterior(tmp_path / "p.pt")
    assert torch.equal(load_posterior(tmp_path / "p.pt", task=task).sample((3,), seed=0), post.sample((3,), seed=0))


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
    payload = torch.load(path, weights_only=True)
    payload["state_dict"].popitem()
    torch.save(payload, tmp_path / "tampered.pt")
    with pytest.raises(ValueError, match="do not fit"):
        load_posterior(tmp_path / "tampered.pt")
    with pytest.raises(FileNotFoundError):
        load_posterior(tmp_path / "missing.pt")


@pytest.mark.parametrize("kind", ["sppe", "sple"])
def test_releases_of_the_wrong_shape_are_refused(posteriors, kind):
    post = posteriors[kind]
    with pytest.raises(ValueError, match="shape"):
        post.sample((5,), y=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="one release"):
        post.sample((5,), y=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="support"):
        post.log_prob(torch.zeros(1, 2), y=torch.tensor([[0.0, math.inf]]))
    with pytest.raises(ValueError, match="theta"):
        post.log_prob(torch.zeros(3, 5))


def test_releases_outside_the_mechanism_support_are_refused():
    """The binomial curve mechanism releases multiples of 1/N in [0, 1]."""
    task = dpsbi.tasks.load("sir", epsilon=10.0)
    post = FlowPosterior(task, ConditionalFlow.blank(FlowConfig(transforms=1, hidden=4), 2, 10), "SPPE", amortized=True)
    with pytest.raises(ValueError, match="outside the support"):
        post.sample((2,), y=torch.full((1, 10), 0.0015))
    with pytest.raises(ValueError, match="outside the support"):
        post.sample((2,), y=torch.full((1, 10), 1.5))
    assert post.sample((2,), y=task.y_obs, seed=0).shape == (2, 2)
    likelihood = LikelihoodPosterior(task, ConditionalFlow.blank(FlowConfig(transforms=1, hidden=4), 10, 2), "SPLE")
    assert likelihood.log_prob(task.prior.mean.expand(3, 2)).shape == (3,)  # at task.y_obs
    with pytest.raises(ValueError, match="outside the support"):
        likelihood.log_prob(task.prior.mean.expand(3, 2), y=torch.full((1, 10), 0.0015))
