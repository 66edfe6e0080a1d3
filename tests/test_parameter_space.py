"""The parameter space copied to the flow's device (``ParameterSpace.on``): a prior density that reads nothing
back to the host (what SPLE's sampler evaluates at every call), equal to the prior's own."""

import pytest
import torch

import dpsbi
from dpsbi.inference.parameters import ParameterSpace

TASKS = [name for name in dpsbi.tasks.names() if name != "custom"]  # custom needs a factory


@pytest.mark.parametrize("name", TASKS)
def test_every_tasks_prior_copied_to_a_device_evaluates_there_alone(name):
    """On the meta device (shapes, no values) a copy to the host or a read of a value raises: the copy's
    ``log_prior_z`` stays there, where the prior's own (on the CPU, its support checked) does not; on the CPU the
    copy's densities are the prior's, bit for bit, and the space on its own device is itself."""
    task = dpsbi.tasks.load(name)
    space = ParameterSpace(task)
    z = space.to_z(task.prior.sample((7,)))
    meta = space.copied_to(torch.device("meta"))
    assert meta.log_prior_z(z.to("meta")).shape == (7,)
    with pytest.raises(NotImplementedError):
        space.log_prior_z(z.to("meta"))
    assert torch.equal(space.copied_to(torch.device("cpu")).log_prior_z(z), space.log_prior_z(z))
    assert space.on("cpu") is space


def test_a_prior_that_cannot_be_copied_stays_where_it_is_and_the_global_stream_is_untouched():
    """A prior that does not pickle (a class local to a function) or whose copy does not evaluate on the device
    (meta: no values to compare) leaves the densities on the prior's device; the check draws from the prior
    without moving torch's global random stream."""

    class LocalNormal(torch.distributions.Normal):
        pass

    task = dpsbi.tasks.load("regression")
    local = ParameterSpace(task)
    local.prior = torch.distributions.Independent(LocalNormal(torch.zeros(3), torch.ones(3)), 1)
    assert local.copied_to(torch.device("meta")) is None and local.on("meta") is local
    space = ParameterSpace(task)
    state = torch.get_rng_state()
    assert space.on("meta") is space
    assert torch.equal(torch.get_rng_state(), state)


def test_a_posterior_evaluates_its_prior_on_the_flows_device(monkeypatch):
    """A posterior's ``device_space`` is its space on the flow's device, made once per device: on the CPU the
    space itself, so that draws and densities there are those of before."""
    task = dpsbi.tasks.load("conjugate_gaussian")
    post = dpsbi.SPLE(
        task,
        rounds=1,
        sims_per_round=50,
        flow=dict(transforms=1, hidden=8),
        training=dict(max_steps=2),
        mcmc=dict(num_chains=10, warmup=2),
        progress=False,
    ).run()
    calls = []
    on = ParameterSpace.on
    monkeypatch.setattr(ParameterSpace, "on", lambda self, device: calls.append(device) or on(self, device))
    assert post.device_space is post.space and post.device_space is post.space
    post.sample((20,), seed=0)
    assert calls == [torch.device("cpu")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_sple_density_on_cuda_never_synchronizes(cuda_synchronizations):
    """SPLE's unnormalized density at a batch of points on CUDA (what each sampler call evaluates): not one
    device-to-host synchronization (the prior was evaluated on the CPU before: a copy there and back a call)."""

    task = dpsbi.tasks.load("regression")
    post = (
        dpsbi.SPLE(
            task,
            rounds=1,
            sims_per_round=100,
            inner_samples=2,
            training=dict(max_steps=5),
            flow=dict(transforms=1, hidden=8),
            progress=False,
        )
        .run()
        .to("cuda")
    )
    z = torch.randn(64, 4, 3, device="cuda")
    y = task.y_obs.to("cuda").expand(64, 1, -1)
    post.log_density_z(z, y)
    torch.cuda.synchronize()
    syncs = cuda_synchronizations(lambda: post.log_density_z(z, y))
    assert not syncs and post.device_space.device.type == "cuda", syncs[:3]
