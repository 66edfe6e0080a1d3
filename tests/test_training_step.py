"""The training step makes no data-dependent host decision: its loss traces whole with
``torch.compile(fullgraph=True)`` (tracing only, ``backend="eager"``: seconds), which any ``.item()``, boolean-mask
indexing or Python branch on a tensor would break; on CUDA a step makes no device-to-host synchronization. Also the
flow backends: the sync-free default against nflows' on the same tasks."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import dpsbi
from dpsbi.inference import FlowSettings
from dpsbi.inference.training import (
    COMPILED_CHECK_STEPS,
    StepKind,
    TrainingSettings,
    _fused,
    _Round,
    batches,
    compiles,
    shaped_steps,
)

TINY = dict(
    sims_per_round=60,
    inner_samples=4,
    flow=dict(transforms=2, hidden=8),
    training=dict(max_epochs=1, accelerator="cpu"),
    progress=False,
)
#: One task per mechanism family: Laplace (regression), Gaussian, the binomial curve (SIR, tau-leaping),
#: discrete Gaussian (census: a vector, by the zCDP conversion; a Poisson count: a scalar, by CKS Thm. 7),
#: randomized response.
TASKS = {
    "regression": dict(epsilon=1.0),
    "poisson_counts": dict(epsilon=0.5, noise="discrete_gaussian"),
    "conjugate_gaussian": dict(epsilon=1.0),
    "sir": dict(epsilon=10.0, simulator="tau_leap"),
    "census_table": dict(),
    "binary_responses": dict(mechanism="randomized_response"),
}


def _fitted(method: str, task_name: str, rounds: int = 1, **kwargs):
    """An estimator after ``rounds`` tiny rounds (its flow and stored simulations are what a step trains on)."""
    task = dpsbi.tasks.load(task_name, **TASKS.get(task_name, {}))
    options = {**TINY, **({"rounds": rounds} if method != "NaiveNPE" else {"num_simulations": 60})}
    options.pop("inner_samples") if method == "NaiveNPE" else None
    if method == "NaiveNPE":
        options.pop("sims_per_round")
    estimator = getattr(dpsbi, method)(task, **options, **kwargs)
    estimator.run()
    return estimator


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_the_sppe_step_traces_whole_in_both_losses(task_name, step_traces_whole):
    """Round 1's loss (proposal = prior) and the atomic loss of later rounds."""
    estimator = _fitted("SPPE", task_name, atoms=5)
    step_traces_whole(estimator, 0)
    step_traces_whole(estimator, 1)


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_the_sple_step_traces_whole(task_name, step_traces_whole):
    step_traces_whole(_fitted("SPLE", task_name, rounds=1), 0)


def test_the_naive_npe_step_traces_whole(step_traces_whole):
    step_traces_whole(_fitted("NaiveNPE", "regression"), 0)


def test_the_combined_loss_step_traces_whole(step_traces_whole):
    step_traces_whole(_fitted("SPPE", "regression", atoms=5, combined_loss=True), 1)


def test_the_combined_loss_needs_atomic_rounds():
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    for kwargs in ({"amortized": True}, {"truncate": 1e-4}):
        with pytest.raises(ValueError, match="combined_loss adds the plain loss to atomic rounds"):
            dpsbi.SPPE(task, combined_loss=True, **kwargs)


@pytest.mark.xfail(
    torch.__version__ < "2.13",
    strict=True,
    reason="torch 2.11's compiler cannot enumerate an object's attributes (batched_copy's vars(mechanism); "
    "scripts/archive/dynamo_copy_probe.py); dpsbi needs torch >= 2.13, which traces it",
)
@pytest.mark.parametrize("method", ["SPPE", "SPLE"])
@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_the_epsilon_conditioned_step_traces_whole(method, task_name, step_traces_whole):
    """An amortized step re-calibrates each family's mechanism at its rows' epsilons without a host decision
    (the analytic Gaussian's calibration read its epsilons on the host, so its compiled steps fell back to eager)."""
    ranges = {"census_table": (3.0, 10.0), "poisson_counts": (0.1, 1.0)}  # a scalar's: one sigma an epsilon
    epsilon_range = ranges.get(task_name, (0.1, 10.0))
    step_traces_whole(_fitted(method, task_name, amortized=True, epsilon_range=epsilon_range), 0)


@pytest.mark.xfail(
    torch.__version__ < "2.13",
    strict=True,
    reason="torch 2.11's compiler cannot enumerate an object's attributes (batched_copy's vars(mechanism))",
)
def test_the_widened_step_traces_whole(step_traces_whole):
    widening = dict(classifier_steps=10)
    step_traces_whole(
        _fitted("SPPE", "regression", amortized=True, epsilon_range=(0.1, 10.0), widening=widening), 0
    )
    step_traces_whole(_fitted("SPPE", "conjugate_gaussian", amortized=True, widening=widening), 0)
    step_traces_whole(
        _fitted("SPLE", "naive_bayes", amortized=True, epsilon_range=(1.0, 10.0), widening=widening), 0
    )


def test_the_sync_free_flow_traces_whole_in_sampling():
    estimator = _fitted("SPPE", "regression")
    flow, noise = estimator.flow, torch.randn(5, 3)
    context = estimator.task.release(estimator._dataset(False)[1][:5])
    torch._dynamo.reset()
    traced = torch.compile(flow.sample, backend="eager", fullgraph=True)(noise, context)
    assert torch.allclose(traced, flow.sample(noise, context), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("method", ["SPPE", "SPLE"])
def test_a_training_step_on_cuda_never_synchronizes(method, graph, cuda_synchronizations):
    """Steps after the first (which builds the optimizer's state, and captures the graph) under torch's sync
    debug mode: not one device-to-host synchronization, eager or replayed as a CUDA graph."""
    estimator = _fitted(method, "regression", **({"atoms": 10} if method == "SPPE" else {}))
    settings = TrainingSettings(accelerator="cuda", compile=False, cuda_graph=graph)
    flow = estimator.flow.to("cuda")
    data = tuple(t.to("cuda") for t in estimator._dataset(False))
    state = _Round(flow, estimator.loss(1 if method == "SPPE" else 0), settings, seed=0, steps=100)
    assert state.graphed == graph
    rows = next(batches(torch.arange(data[0].shape[0], device="cuda"), 50))
    state.step(data, rows)
    torch.cuda.synchronize()
    syncs = cuda_synchronizations(lambda: [state.step(data, rows) for _ in range(3)])
    assert not syncs, syncs[:3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["SPPE", "SPLE"])
def test_a_step_replayed_as_a_cuda_graph_is_the_eager_step(method):
    """The same steps (two batch sizes, the cosine schedule, deterministic kernels) eager and replayed as CUDA
    graphs: the same losses and the same weights after them."""
    from dpsbi.inference.training import _deterministic

    estimator = _fitted(method, "regression", **({"atoms": 10} if method == "SPPE" else {}))
    data = tuple(t.to("cuda") for t in estimator._dataset(False))
    order = torch.arange(data[0].shape[0], device="cuda")
    plan = [order[:40], order[:40], order[40:100], order[:40], order[40:100], order[:40]]
    results = []
    for graph in (False, True):
        flow = copy.deepcopy(estimator.flow).to("cuda")
        settings = TrainingSettings(accelerator="cuda", compile=False, cuda_graph=graph, max_steps=6)
        state = _Round(flow, estimator.loss(1 if method == "SPPE" else 0), settings, seed=3, steps=6)
        with _deterministic(torch.device("cuda")):
            losses = torch.stack([state.step(data, rows) for rows in plan])
        results.append((losses, [p.detach().clone() for p in flow.parameters()]))
    (eager_losses, eager_weights), (graph_losses, graph_weights) = results
    assert torch.allclose(graph_losses, eager_losses, rtol=1e-5, atol=1e-6), (graph_losses, eager_losses)
    for a, b in zip(graph_weights, eager_weights, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(eager_weights, estimator.flow.parameters()))


def test_cuda_graphs_are_refused_where_they_cannot_run():
    with pytest.raises(ValueError, match="training cuda_graph=True needs CUDA"):
        TrainingSettings(accelerator="cpu", cuda_graph=True)
    with pytest.raises(ValueError, match="training cuda_graph=True needs CUDA"):
        TrainingSettings(compile=True, cuda_graph=True)
    assert not _Round(
        torch.nn.Linear(2, 2), dpsbi.inference.training.Loss(None), TrainingSettings(), 0, 10
    ).graphed
    # a long round on CUDA compiles under compile="auto", unless cuda_graph=True asks for the graph instead
    cuda = torch.device("cuda")
    assert compiles(TrainingSettings(), cuda, 5000) and not compiles(
        TrainingSettings(cuda_graph=True), cuda, 5000
    )


@pytest.mark.parametrize(
    "device",
    [
        pytest.param(
            "cpu",
            marks=[
                pytest.mark.skipif(
                    torch.cuda.is_available(),
                    reason="the GPU check runs the CUDA case only (its time budget)",
                ),
            ],
        ),
        pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
    ],
)
def test_the_compiled_spline_has_the_eager_gradients(device):
    """The spline compiled by torch's code generator (inductor) against eager, values and gradients: what a
    compiled training step rests on. On the CPU (torch 2.13) the gradients of the widths and heights were off by
    75-132 % while the knots' running sum was a ``cumsum`` after the softmax (docs/RESULTS.md, "Compiled on the
    CPU"); ``running_sum`` is a triangular product while compiling, and this fails if that goes."""
    from dpsbi.inference.spline_flow import OneHotRQSTransform

    generator = torch.Generator().manual_seed(0)
    params = [torch.randn(512, 8, k, generator=generator).to(device) for k in (10, 10, 9)]
    x = (torch.randn(512, 8, generator=generator) * 3).to(device)  # some beyond the bound 5

    def objective(widths, heights, derivatives):
        y, ladj = OneHotRQSTransform(widths, heights, derivatives, bound=5.0).call_and_ladj(x)
        return y.sin().mean() + ladj.mean()

    out = []
    for run in (objective, torch.compile(objective, fullgraph=True, dynamic=False)):
        leaves = [p.clone().requires_grad_(True) for p in params]
        value = run(*leaves)
        out.append((value.detach(), torch.autograd.grad(value, leaves)))
    (eager, eager_grads), (compiled, compiled_grads) = out
    assert torch.allclose(eager, compiled, rtol=1e-5)
    for a, b in zip(eager_grads, compiled_grads, strict=True):
        assert float((a - b).norm() / a.norm()) < 1e-4


def test_the_knots_compiled_keep_their_precision_under_autocast():
    """While compiling, the knots' running sum is a product with a triangular matrix of ones, under autocast
    (bf16-mixed) still in float32 as the eager cumsum (in bfloat16 narrow bins would merge into bins of width 0)."""
    from dpsbi.inference.spline_flow import running_sum

    w = torch.randn(64, 11, generator=torch.Generator().manual_seed(0)) * 3
    knots = torch.compile(lambda w: running_sum(w.softmax(-1)), fullgraph=True, dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled = knots(w)
    assert compiled.dtype == torch.float32
    assert torch.allclose(compiled, w.softmax(-1).cumsum(-1), atol=1e-6)


def test_compile_is_a_bool_or_auto():
    # 1 equals True, so it would slip past an `is True` check: it is no setting at all
    with pytest.raises(ValueError, match="invalid training settings: compile=1"):
        TrainingSettings(accelerator="cpu", compile=1)
    assert compiles(TrainingSettings(accelerator="cpu", compile=True), torch.device("cpu"), 10)


def test_auto_compiles_a_kind_of_step_the_fit_takes_enough_of_on_the_cpu(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(dpsbi.inference.training, "cpu_compiler", lambda: True)
    auto = TrainingSettings()
    assert compiles(auto, cpu, 570, StepKind(4000, 4655))  # SPLE's amortized fit on naive Bayes
    assert compiles(auto, cpu, 1000, StepKind(1000, 9481))  # regression's atomic SPPE rounds at y_obs
    assert compiles(auto, cpu, 2000, StepKind(100, 19959))  # SIR's truncated SPPE rounds at y_obs
    assert compiles(auto, cpu, 1000, StepKind(100, 10096))  # naive Bayes' truncated SPPE rounds
    assert not compiles(auto, cpu, 1000, StepKind(100, 1007))  # regression's first round (a kind of its own)
    assert not compiles(auto, cpu, 500, StepKind(800, 3518))  # sequential SPLE
    assert not compiles(auto, cpu, 10**9, StepKind(10**9, None)) and not compiles(auto, cpu, 10**9, None)
    assert not compiles(TrainingSettings(compile=False), cpu, 1, StepKind(4000, 10**6))
    monkeypatch.setattr(dpsbi.inference.training, "cpu_compiler", lambda: False)  # no C++ compiler found
    assert not compiles(auto, cpu, 1, StepKind(4000, 10**6))


def _compiler_standin(loss_factor: float = 1.0, fails: bool = False):
    """A stand-in for ``torch.compile``: the loss times ``loss_factor`` (a compiler bug's stand-in when not 1), or
    an error at every call (``fails``: a C++ build that fails), warning at its first call as torch 2.13's compiler
    does (of a deprecated function of its own)."""

    def compile(f, **options):
        calls = []

        def compiled(*args):
            if fails:
                raise RuntimeError("the C++ build failed")
            if not calls:
                warnings.warn("`torch._prims_common.check` is deprecated", FutureWarning, stacklevel=1)
            calls.append(None)
            return loss_factor * f(*args)

        return compiled

    return compile


def _square_loss(flow, batch, draws):
    warnings.warn("the user's own warning", UserWarning, stacklevel=1)
    return flow(batch[0]).square().mean()


def test_a_compiled_step_silences_torchs_compiler_deprecation_and_nothing_else(monkeypatch):
    monkeypatch.setattr(torch, "compile", _compiler_standin())
    state = _Round(
        torch.nn.Linear(2, 1),
        dpsbi.inference.training.Loss(_square_loss),
        TrainingSettings(accelerator="cpu", compile=True),
        0,
        10,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            state.step((torch.randn(8, 2),), torch.arange(8))
    assert state.compiled and {str(w.message) for w in caught} == {"the user's own warning"}


def test_a_passing_check_leaves_the_round_as_it_was(monkeypatch):
    """The compiled round's check (an eager and a compiled gradient on its first batch) changes neither the weights
    nor Adam's state: with a compiler that compiles nothing, a compiled round equals an eager one bit for bit."""
    monkeypatch.setattr(torch, "compile", _compiler_standin())
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data = (torch.randn(20, 2, generator=torch.Generator().manual_seed(0)),)
    start, weights = torch.nn.Linear(2, 1).state_dict(), []
    for compile in (True, False):
        flow = torch.nn.Linear(2, 1)
        flow.load_state_dict(start)
        state = _Round(flow, loss, TrainingSettings(accelerator="cpu", compile=compile, batch_size=8), 0, 10)
        for rows in (torch.arange(8), torch.arange(8, 20), torch.arange(8)):  # checked, eager, compiled
            state.step(data, rows)
        weights.append(list(flow.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_a_compiled_round_compiles_one_shape(monkeypatch):
    """A compiled round runs its compiled loss on batches of its epochs' first batch's size only: the last batch,
    larger where the rows do not divide into batches, runs eagerly (a second shape would be a second compile), and
    a round of one batch compiles that batch's size."""
    shapes = []

    def compile(f, **options):
        def compiled(flow, batch, draws):
            shapes.append(batch[0].shape[0])
            return f(flow, batch, draws)

        return compiled

    monkeypatch.setattr(torch, "compile", compile)
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    for rows, expected in ((20, [8, 8]), (12, [12, 12])):  # batches of 8 and 12; one batch of 12
        data = (torch.randn(rows, 2, generator=torch.Generator().manual_seed(0)),)
        state = _Round(
            torch.nn.Linear(2, 1),
            loss,
            TrainingSettings(accelerator="cpu", compile=True, batch_size=8),
            0,
            10,
        )
        shapes.clear()
        for _ in range(2):
            state.train_epoch(data)
        assert shapes == expected and state.compiled
    assert (
        dpsbi.inference.training.first_batch(16, 8) == 8 and dpsbi.inference.training.first_batch(15, 8) == 15
    )


def test_a_kind_of_step_counts_the_steps_that_run_compiled():
    """``compile="auto"`` prices a kind of step by the steps a compiled round runs compiled (``shaped_steps``): a
    round's planned steps but each epoch's larger last batch (SPLE's first round: 950 rows, 9 batches an epoch, 56
    epochs under ``max_steps=500``), summed over the fit's rounds of that kind (sequential SPLE's default fit on
    regression: 7 rounds of 950 more rows each)."""
    settings = TrainingSettings(batch_size=100, max_steps=500)
    assert dpsbi.inference.training.planned_steps(settings, 950) == (9, 504)
    assert [shaped_steps(settings, rows) for rows in (950, 1900, 150, 99)] == [56 * 8, 19 * 27, 500, 500]
    assert shaped_steps(TrainingSettings(batch_size=100, max_steps=None, lr_schedule="constant"), 950) is None
    estimator = dpsbi.SPLE(dpsbi.tasks.load("regression", epsilon=1.0), progress=False)
    rows = [950 * (r + 1) for r in range(estimator.rounds)]
    assert estimator.step_kind(0, 950) == StepKind(
        800, sum(shaped_steps(estimator.training, n) for n in rows)
    )
    planned = sum(dpsbi.inference.training.planned_steps(estimator.training, n)[1] for n in rows)
    assert estimator.step_kind(0, 950).fit_steps < planned


@pytest.mark.parametrize("precision", ["32-true", "64-true", "bf16-mixed"])
def test_adam_is_fused_on_the_cpu_and_steps_as_torchs_loop_does(precision):
    """A CPU round's Adam is torch's fused kernel in every precision a fit takes, and its steps agree with the
    per-tensor loop's (torch's CPU default) to rounding."""
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    dtype = torch.float64 if precision == "64-true" else torch.float32
    data = (torch.randn(20, 2, generator=torch.Generator().manual_seed(0), dtype=dtype),)
    start, weights = torch.nn.Linear(2, 1).to(dtype).state_dict(), []
    settings = TrainingSettings(accelerator="cpu", precision=precision)
    for fused in (True, False):
        flow = torch.nn.Linear(2, 1).to(dtype)
        flow.load_state_dict(start)
        state = _Round(flow, loss, settings, 0, 10)
        assert state.optimizer.param_groups[0]["fused"] is True
        if not fused:
            state.optimizer = torch.optim.Adam(
                flow.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
            )
        for _ in range(5):
            state.step(data, torch.arange(20))
        weights.append(torch.cat([p.detach().flatten() for p in flow.parameters()]))
    assert not torch.equal(weights[0], torch.cat([start["weight"].flatten(), start["bias"]]))  # it moved
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)
    assert _fused(torch.device("mps")) == {}


def test_a_compiled_fit_reports_its_largest_gradient_error(monkeypatch):
    """``fit_flow`` returns the largest relative error of the compiled gradient over a compiled round's checks, and
    nothing of it for an eager round."""
    monkeypatch.setattr(torch, "compile", _compiler_standin(loss_factor=1.0 + 1e-4))
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data = (torch.randn(40, 2, generator=torch.Generator().manual_seed(0)),)
    for compile in (True, False):
        settings = TrainingSettings(accelerator="cpu", compile=compile, batch_size=8, max_steps=12)
        history = dpsbi.inference.training.fit_flow(torch.nn.Linear(2, 1), loss, data, data, settings, seed=0)
        if compile:
            assert history["compile_gradient_error"] == pytest.approx(1e-4, rel=1e-2)
        else:
            assert "compile_gradient_error" not in history


def test_auto_trains_eagerly_where_the_compiler_fails_to_build(monkeypatch):
    monkeypatch.setattr(torch, "compile", _compiler_standin(fails=True))
    monkeypatch.setattr(dpsbi.inference.training, "cpu_compiler", lambda: True)
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data, rows = (torch.randn(8, 2),), torch.arange(8)
    state = _Round(
        torch.nn.Linear(2, 1), loss, TrainingSettings(accelerator="cpu"), 0, 10, kind=StepKind(10**6, 10**6)
    )
    with pytest.warns(
        RuntimeWarning, match=r"compiler failed \(RuntimeError\) .*; this round and the fit's later ones"
    ):
        state.step(data, rows)
    assert not state.compiled
    state = _Round(torch.nn.Linear(2, 1), loss, TrainingSettings(accelerator="cpu", compile=True), 0, 10)
    with pytest.raises(RuntimeError, match="the C\\+\\+ build failed"):
        state.step(data, rows)


def test_a_compiled_loss_whose_gradient_is_wrong_is_refused_or_trained_eagerly(monkeypatch):
    """Each compiled round checks the compiled loss's gradient against eager on its first batch, and a batch off
    on the next batch too (its own step eager): off on both, ``compile=True`` refuses it in one line, ``"auto"``
    warns in one line and trains the round eagerly. (``torch.compile`` replaced by a loss twice the true one: a
    compiler bug's stand-in.)"""
    monkeypatch.setattr(torch, "compile", _compiler_standin(loss_factor=2.0))
    monkeypatch.setattr(dpsbi.inference.training, "cpu_compiler", lambda: True)
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data, rows = (torch.randn(8, 2, generator=torch.Generator().manual_seed(0)),), torch.arange(8)
    state = _Round(torch.nn.Linear(2, 1), loss, TrainingSettings(accelerator="cpu", compile=True), 0, 10)
    state.step(data, rows)
    with pytest.raises(
        dpsbi.inference.training.CompiledGradientError,
        match=r"gradient is 100.00% off the eager one's on two checked batches in a row \(the second at step 2\)",
    ):
        state.step(data, rows)
    flow = torch.nn.Linear(2, 1)
    eager_value = loss.compute(flow, data, ())
    state = _Round(flow, loss, TrainingSettings(accelerator="cpu"), 0, 10, kind=StepKind(10**6, 10**6))
    assert state.compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = state.step(data, rows)  # off once: this step eager, the next batch checked too
    assert state.compiled and torch.equal(value, eager_value.detach())
    eager_value = loss.compute(flow, data, ())
    with pytest.warns(
        RuntimeWarning, match="100.00% off .* this round and the fit's later ones train eagerly"
    ):
        value = state.step(data, rows)
    assert not state.compiled and torch.equal(value, eager_value.detach())
    assert state.gradient_errors == [pytest.approx(1.0), pytest.approx(1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state.step(data, rows)  # once a round


def test_a_batch_off_once_is_trained_eagerly_and_the_round_stays_compiled(monkeypatch):
    """A compiled gradient off on one checked batch and right on the next (a value on a spline knot put in the next
    bin compiled than eager: no bug) costs one eager step and one more check, nothing else: no warning, the
    round stays compiled and equals, step for step, an eager round but for its compiled steps."""
    calls = []

    def compile(f, **options):
        def compiled(*args):
            calls.append(None)
            return (2.0 if len(calls) == 1 else 1.0) * f(*args)  # off at the first check only

        return compiled

    monkeypatch.setattr(torch, "compile", compile)
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data = (torch.randn(16, 2, generator=torch.Generator().manual_seed(0)),)
    start, weights, checks = torch.nn.Linear(2, 1).state_dict(), [], {}
    for setting in (True, False):
        flow = torch.nn.Linear(2, 1)
        flow.load_state_dict(start)
        state = _Round(flow, loss, TrainingSettings(accelerator="cpu", compile=setting, batch_size=8), 0, 10)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            state.train_epoch(data)
            state.train_epoch(data)
        assert state.compiled is setting and not state.doubted
        weights.append(list(flow.parameters()))
        checks[setting] = len(state.gradient_errors)
    # epoch 1: the first check (off; its step eager), the second batch's check (its step: the checked gradient is
    # the step's own, not computed again); epoch 2: two compiled steps, unchecked (COMPILED_CHECK_STEPS apart)
    assert len(calls) == 1 + 1 + 2 and checks == {True: 2, False: 0}
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_a_compiled_loss_is_checked_every_compiled_check_steps_steps(monkeypatch):
    """torch 2.13's CPU compiler got some batches of a loss wrong and others right: a compiled round checks its
    gradient on its first full batch and then on the first full batch ``COMPILED_CHECK_STEPS`` steps after its last
    check, no sooner (each check costs an eager step), so a compiler right on its first two calls and wrong after
    is caught there (``compile=True``: refused at the doubted batch's confirmation, the step after)."""
    calls, wrong = [], []

    def compile(f, **options):
        def compiled(*args):
            calls.append(None)
            return (2.0 if wrong else 1.0) * f(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", compile)
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data = (torch.randn(16, 2, generator=torch.Generator().manual_seed(0)),)  # two full batches an epoch
    settings = TrainingSettings(accelerator="cpu", compile=True, batch_size=8)
    state = _Round(torch.nn.Linear(2, 1), loss, settings, 0, 100)
    state.train_epoch(data)  # its first batch checked right; its second compiled, unchecked
    assert state.gradient_errors == [0.0] and state.next_check == 1 + COMPILED_CHECK_STEPS
    calls.clear()  # 49 more epochs: no check before step 101
    for _ in range(49):
        state.train_epoch(data)
    assert state.gradient_errors == [0.0] and len(calls) == 98
    state.train_epoch(data)  # step 101 checked
    assert len(state.gradient_errors) == 2 and state.next_check == 101 + COMPILED_CHECK_STEPS

    monkeypatch.setattr(dpsbi.inference.training, "COMPILED_CHECK_STEPS", 3)
    state = _Round(torch.nn.Linear(2, 1), loss, settings, 0, 100)
    state.train_epoch(data)  # steps 1 (checked right) and 2 (compiled, right)
    wrong.append(True)
    state.train_epoch(data)  # step 3 compiled, wrong and unchecked; step 4 checked: off once, its step eager
    assert state.doubted and state.gradient_errors == [0.0, pytest.approx(1.0)]
    with pytest.raises(
        dpsbi.inference.training.CompiledGradientError,
        match=r"two checked batches in a row \(the second at step 5\)",
    ):
        state.train_epoch(data)


@pytest.mark.parametrize("wrong_calls", [{1}, {1, 2}])
def test_a_doubted_batch_is_confirmed_at_the_next_epochs_first_batch(monkeypatch, wrong_calls):
    """Where an epoch has one full batch (and a larger last batch, eager), a first batch off once is confirmed at
    the next epoch's first batch: right there, the round stays compiled; off there too, ``compile=True`` refuses."""
    calls = []

    def compile(f, **options):
        def compiled(*args):
            calls.append(None)
            return (2.0 if len(calls) in wrong_calls else 1.0) * f(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", compile)
    loss = dpsbi.inference.training.Loss(lambda flow, batch, draws: flow(batch[0]).square().mean())
    data = (torch.randn(20, 2, generator=torch.Generator().manual_seed(0)),)  # batches of 8 and 12
    settings = TrainingSettings(accelerator="cpu", compile=True, batch_size=8)
    state = _Round(torch.nn.Linear(2, 1), loss, settings, 0, 10)
    state.train_epoch(data)
    assert state.doubted and len(calls) == 1
    if wrong_calls == {1}:
        state.train_epoch(data)
        assert state.compiled and not state.doubted and state.gradient_errors[1] == 0.0
    else:
        with pytest.raises(
            dpsbi.inference.training.CompiledGradientError, match="two checked batches in a row"
        ):
            state.train_epoch(data)


def test_a_fit_whose_compiler_failed_does_not_try_again(monkeypatch):
    """Under ``"auto"`` a round whose compiler fails trains eagerly after one warning, and so do the fit's later
    rounds without trying again (a failed check costs a compile each time), resumed or not."""
    builds = []

    def failing(f, **options):
        builds.append(None)
        return _compiler_standin(fails=True)(f, **options)

    monkeypatch.setattr(torch, "compile", failing)
    monkeypatch.setattr(
        dpsbi.inference.training, "compiles", lambda settings, *a, **k: settings.compile == "auto"
    )
    with pytest.warns(RuntimeWarning, match="this round and the fit's later ones train eagerly") as caught:
        estimator = _fitted("SPPE", "conjugate_gaussian", rounds=3, amortized=True)
    assert len(builds) == 1 and len([w for w in caught if w.category is RuntimeWarning]) == 1
    assert [entry.get("compile_fell_back", False) for entry in estimator.history] == [True, False, False]
    assert estimator.round_training().compile is False and estimator.training.compile == "auto"


def test_a_fit_tells_compile_auto_its_kinds_of_step_over_the_whole_fit(monkeypatch):
    seen = []

    def recording(settings, device, steps, kind=None):
        seen.append((steps, kind))
        return False

    monkeypatch.setattr(dpsbi.inference.training, "compiles", recording)
    # a first round, then atomic rounds; patience 1 stops a round at its first epoch without improvement
    task = dpsbi.tasks.load("conjugate_gaussian", **TASKS["conjugate_gaussian"])
    training = dict(accelerator="cpu", patience=1, max_steps=60)
    estimator = dpsbi.SPPE(task, **{**TINY, "rounds": 3, "training": training})
    estimator.run()
    ran = [entry["steps"] for entry in estimator.history]
    first, atomic = estimator.step_work(0), estimator.step_work(1)
    assert atomic == 10 * first and ran[1] < seen[1][0]  # round 2 stopped early
    assert seen[0][1] == StepKind(first, seen[0][0])  # its own kind: this round alone
    # the atomic rounds' kind spans both, counted at their plans: the same total in both rounds, so that an early
    # stop cannot turn a compiled kind eager after its compile is paid
    assert seen[1][1] == seen[2][1] == StepKind(atomic, seen[1][0] + seen[2][0])


def test_the_one_hot_spline_is_zukos_spline_value_for_value():
    """Knots picked by a one-hot product instead of ``gather``: the same values, inverse, log-determinants and
    gradients, bit for bit, inside the bound and in the tails."""
    from zuko.transforms import MonotonicRQSTransform

    from dpsbi.inference.spline_flow import OneHotRQSTransform

    torch.manual_seed(0)
    params = [torch.randn(200, 3, k, dtype=torch.float64, requires_grad=True) for k in (10, 10, 9)]
    x = torch.randn(200, 3, dtype=torch.float64) * 4  # about a fifth beyond the bound 5
    out = []
    for kind in (MonotonicRQSTransform, OneHotRQSTransform):
        spline = kind(*params, bound=5.0)
        y, ladj = spline.call_and_ladj(x)
        back = spline.inv(y)
        grads = torch.autograd.grad((y.sum() + ladj.sum() + back.sum()), params)
        out.append((y, ladj, back, *grads))
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)
    back, inverse_ladj = OneHotRQSTransform(*params, bound=5.0).inv_and_ladj(out[1][0])
    assert torch.equal(back, out[1][2]) and torch.allclose(inverse_ladj, out[1][1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("dim, context_dim", [(1, 1), (2, 3), (5, 8)])
def test_the_sync_free_flow_is_a_normalized_invertible_density(dim, context_dim):
    """float64: sample inverts log_prob's map to the noise, and log_prob integrates to 1 (1D grid, and the
    change of variables on a 2D grid)."""
    torch.manual_seed(0)
    x, c = (
        torch.randn(50, dim, dtype=torch.float64) * 3 + 1,
        torch.randn(50, context_dim, dtype=torch.float64),
    )
    flow = dpsbi.inference.ConditionalFlow(FlowSettings(transforms=3, hidden=16), x, c).double()
    with torch.no_grad():  # a non-trivial flow
        for p in flow.parameters():
            p.add_(0.2 * torch.randn_like(p))
    noise = torch.randn(50, dim, dtype=torch.float64)
    back, log_q = flow.sample_and_log_prob(noise, c)
    assert torch.equal(back, flow.sample(noise, c))
    assert torch.allclose(log_q, flow.log_prob(back, c), rtol=0, atol=1e-9)
    z, embedded = (back - flow.spline.mean) / flow.spline.std, flow.embedding(c)
    for layer in flow.spline.layers:
        z, _ = layer(z, embedded)
    assert torch.allclose(z, noise, atol=1e-9)
    if dim <= 2:
        step = 0.02 if dim == 1 else 0.1
        axis = torch.arange(-40, 40, step, dtype=torch.float64) + step / 2
        grid = axis.unsqueeze(-1) if dim == 1 else torch.cartesian_prod(axis, axis)
        with torch.no_grad():
            mass = flow.log_prob(grid, c[:1].expand(len(grid), -1)).exp().sum() * step**dim
        assert float(mass) == pytest.approx(1.0, abs=2e-3)


def test_files_and_checkpoints_written_before_the_backend_existed_read_as_nflows():
    assert FlowSettings.recorded({"transforms": 2}).backend == "nflows"
    assert FlowSettings.recorded({"transforms": 2, "backend": "dpsbi"}).backend == "dpsbi"
    assert FlowSettings().backend == "dpsbi"
    with pytest.raises(ValueError, match="unknown flow backend 'zuko'"):
        FlowSettings(backend="zuko")


@pytest.mark.parametrize("backend", ["dpsbi", "nflows"])
def test_both_backends_save_load_and_sample_the_same_draws(tmp_path, backend):
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    post = dpsbi.SPPE(task, rounds=1, **{**TINY, "flow": dict(transforms=2, hidden=8, backend=backend)}).run()
    post.save(tmp_path / "p.pt")
    again = dpsbi.load_posterior(tmp_path / "p.pt")
    assert again.flow.config.backend == backend
    assert torch.equal(post.sample((50,), seed=3), again.sample((50,), seed=3))
