"""Posterior objects: densities in the prior's space, release validation, and the save/load file format."""

import dataclasses
import math
import pickle
import re

import pytest
import torch

import dpsbi
import dpsbi.inference.posterior as posterior_module
from dpsbi.files import load_sealed, save_sealed
from dpsbi.inference import ConditionalFlow, FlowConfig, FlowPosterior, LikelihoodPosterior, load_posterior
from dpsbi.mechanisms import Laplace
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


def _damaged_copies(data: bytes, flips: int, cuts: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """``flips`` copies of ``data`` with 16 consecutive bytes XOR-ed (each byte changed) at a random place,
    and ``cuts`` copies truncated at a random length."""
    g = torch.Generator().manual_seed(seed)
    copies = []
    for _ in range(flips):
        start = int(torch.randint(0, len(data) - 16, (), generator=g))
        mask = torch.randint(1, 256, (16,), generator=g).tolist()
        flipped = bytes(b ^ m for b, m in zip(data[start : start + 16], mask))
        copies.append(("flip", data[:start] + flipped + data[start + 16 :]))
    for _ in range(cuts):
        copies.append(("cut", data[: int(torch.randint(0, len(data), (), generator=g))]))
    return copies


def test_damaged_posterior_files_are_refused_or_load_unchanged(task, tmp_path):
    """Flipped bytes and truncations at random places: each file is refused, or (flips in bytes torch
    ignores, such as the archive's padding) loads with exactly the original draws; none loads as another
    posterior or with NaN draws."""
    post = _random_flow_posterior(task, amortized=True)
    path = tmp_path / "p.pt"
    post.save(path)
    original = post.sample((200,), seed=0)
    counts = {(kind, outcome): 0 for kind in ("flip", "cut") for outcome in ("refused", "identical", "different")}
    for kind, data in _damaged_copies(path.read_bytes(), flips=40, cuts=10):
        path.write_bytes(data)
        try:
            draws = load_posterior(path).sample((200,), seed=0)
        except (ValueError, RuntimeError):  # ValueError: refused at load; RuntimeError: NaN draws refused
            counts[kind, "refused"] += 1
            continue
        counts[kind, "identical" if torch.equal(draws, original) else "different"] += 1
    assert counts["flip", "different"] == 0 and counts["cut", "different"] == 0, counts
    assert counts["cut", "refused"] == 10 and counts["flip", "refused"] >= 30, counts


@pytest.mark.parametrize("version, write", [(1, torch.save), (3, save_sealed)])
def test_posterior_files_of_another_format_version_are_refused(task, tmp_path, version, write):
    path = tmp_path / "p.pt"
    _random_flow_posterior(task, amortized=True).save(path)
    payload = load_sealed(path, "posterior")
    write({**payload, "version": version}, path)  # version 1 files carried no checksum
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}.*format version {version}.*reads version 2"):
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
    shift = next(value for key, value in post.flow.state_dict().items() if key.endswith("_shift"))
    shift[0] = math.nan  # the flow's output shift (its z-scoring): every draw gets a NaN coordinate
    with pytest.raises(RuntimeError, match="SPPE posterior of task 'conjugate_gaussian': 5 of 5 draws are NaN/inf"):
        post.sample((5,), seed=0)
    likelihood = _random_flow_posterior(task, LikelihoodPosterior, mcmc=dict(num_chains=2, warmup=0, init_candidates=10))
    monkeypatch.setattr(posterior_module, "slice_sample", lambda *args: torch.tensor([[0.0, 0.0], [math.inf, 0.0], [0.0, 1.0]]))
    with pytest.raises(RuntimeError, match="SPPE posterior of task 'conjugate_gaussian': 1 of 3 draws are NaN/inf"):
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
    assert "epsilon: 1.0 vs 10.0" in str(refused.value) and "mechanism.epsilon: 1.0 vs 10.0" in str(refused.value)
    assert "mechanism.sigma" in str(refused.value)
    laplace = dataclasses.replace(at_1, mechanism=Laplace(1.0, 1.0, dim=2), spec=None)
    with pytest.raises(ValueError, match="mechanism.type: 'Gaussian' vs 'Laplace'"):
        load_posterior(path, task=laplace)
    same = load_posterior(path, task=dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0))
    assert torch.equal(same.sample((3,), seed=0), post.sample((3,), seed=0))


def test_a_changed_registered_task_definition_is_caught(task, tmp_path, monkeypatch):
    path = tmp_path / "p.pt"
    _random_flow_posterior(task, amortized=True).save(path)
    make = dpsbi.tasks._REGISTRY["conjugate_gaussian"]
    monkeypatch.setitem(dpsbi.tasks._REGISTRY, "conjugate_gaussian", lambda **kwargs: make(**kwargs, sensitivity=2.0))
    with pytest.raises(ValueError, match=r"mechanism.sensitivity: 1.0 vs 2.0"):
        load_posterior(path)


def _flow_batch_sizes(flow: ConditionalFlow, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of rows of every ``flow.sample`` / ``flow.log_prob`` call."""
    sizes: list[int] = []
    for name in ("sample", "log_prob"):
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
    whole = post.sample((5, 10), seed=3) if cls is FlowPosterior else None
    whole_log_prob = post.log_prob(theta)
    sizes = _flow_batch_sizes(post.flow, monkeypatch)
    monkeypatch.setattr(posterior_module, "CHUNK_ROWS", 7)
    if cls is FlowPosterior:  # the likelihood posterior's MCMC calls the flow with num_chains rows
        assert torch.allclose(post.sample((5, 10), seed=3), whole, rtol=1e-5, atol=1e-5)
    assert torch.allclose(post.log_prob(theta), whole_log_prob, rtol=1e-5, atol=1e-5)
    assert sizes and max(sizes) <= 7


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
