"""Sequential Private Posterior Estimation: a posterior flow ``q(theta | y)`` trained on releases redrawn from
the stored confidential summaries at every step, with atomic APT or truncated-prior (TSNPE) proposals."""

from __future__ import annotations

import torch
from torch import Tensor

from ..mechanisms.base import check_flag, check_integer
from ..tasks import Task, with_options
from .estimator import SequentialEstimator
from .losses import atom_indices, noise_uniforms, posterior_log_prob, sppe_loss
from .posterior import FlowPosterior, Posterior
from .training import Loss, TrainingSettings
from .truncation import truncated_prior_draws
from .widening import Widening, resolve_widening, widening_problem

#: The most parameters and statistics (numbers) that an amortized fit's default simulations keep: census_table's
#: 46 cells and 3 parameters at 10 rounds of 100 000 (49 million) held 1.75 GB in the last round, 3.85 GB at the
#: peak of fit and scoring (docs/RESULTS.md, "Simulations that are cheap: a million for an amortized fit").
AMORTIZED_STORED_NUMBERS = 50_000_000
#: Rounds where the call leaves them out and the task's recipe has none (:meth:`SPPE.resolve_arguments`).
ROUNDS = 10
#: What a task's ``amortized_recipe`` and ``sequential_recipe`` may set (:meth:`SPPE.recipe`).
AMORTIZED_RECIPE_KEYS = frozenset({"rounds", "sims_per_round", "training", "task_options", "epsilon_margin"})
SEQUENTIAL_RECIPE_KEYS = frozenset({"truncate", "sims_per_round", "training"})


class SPPE(SequentialEstimator):
    """Sequential private posterior estimation (main paper, Alg. 1).

    The first round trains on prior draws with ``-mean log q(theta_i | y_ij)``; later rounds propose from
    ``q(. | y_obs)`` and train with atomic APT (``atoms`` contrasting parameters per pair), or, where the task
    says so (SIR, naive Bayes), from the prior cut to that posterior's region (``truncate``, below). Each
    pair's ``inner_samples`` releases ``y_ij = G(s_i, u_ij)`` come from fresh RQMC (``qmc=True``) or MC uniforms.
    After one round the posterior is amortized (valid at any release).

    ``amortized=True``: every round draws from the prior and trains with the first round's loss (plain NPE on prior
    draws: the atomic correction is for proposals other than the prior), so the posterior is valid at any
    release after any round; with ``epsilon_range=(low, high)`` it is valid at any epsilon in the range too, the
    flow being ``q(theta | y, log epsilon)`` (:class:`~dpsbi.inference.estimator.SequentialEstimator`). An
    amortized fit draws 100 000 simulations a round where the call leaves ``sims_per_round`` out (10 rounds: a
    million prior draws; fewer where they would not fit in memory, 10 000 where ``task.costly_simulator``:
    :meth:`default_sims_per_round`) on batches of 1000 (:meth:`default_batch_size`) without weight decay
    (:meth:`default_weight_decay`): it must learn the posterior at every release, and every epsilon of a range,
    from prior draws alone. Measured (docs/RESULTS.md, "Why the narrow end fell short, and the amortized
    defaults" and "Simulations that are cheap"; one CPU thread): on naive Bayes over epsilon 1-10 mean C2ST
    0.60-0.62 at 1000 a round, 0.51-0.55 at 10 000 and 0.50-0.52 at 100 000 (20 prior-predictive releases at
    each of three epsilons); on regression over 0.1-10 at its stored releases 0.75 / 0.57 / 0.58 at epsilon 10
    / 1 / 0.1 at 1000 a round against 0.65 / 0.56 / 0.53 at 10 000 (two seeds).

    ``combined_loss=True`` (sbi's ``use_combined_loss``): the atomic rounds also score the first round's prior
    draws by the plain loss ``-log q(theta | y)``, at no extra flow evaluation. The atomic loss compares ``q`` only
    at the atoms, so it leaves ``q``'s mass elsewhere free; on SIR at epsilon 1 that leaked mass shows as tails
    that make the sd 1.2-2.0x the reference's while the central 95 % width is right (docs/RESULTS.md, "SIR's
    wide tails"); with it, 1.1-1.3x (``truncate`` removes them: 0.89-1.11x at epsilon 0.1 and 1 in three seeds).
    Off by default: SIR truncates instead.

    ``widening`` (a :class:`~dpsbi.inference.widening.Widening`, a dict of its fields, ``True`` for its defaults,
    ``False`` for none; amortized fits on Laplace or Gaussian noise): each coordinate of a training release takes
    its noise ``factor`` times larger with probability ``share``, and the loss is importance-weighted back to the
    exact posterior, so that releases with one coordinate far out, rare under the mechanism, are common in training
    (:mod:`~dpsbi.inference.widening`). ``None``: :meth:`default_widening`, on for tasks that say their missed
    releases are far noise draws (naive Bayes), off elsewhere; measured in docs/RESULTS.md, "Widened noise at the
    default".

    A task may carry its own measured recipe for an amortized fit (:attr:`~dpsbi.tasks.base.Task.amortized_recipe`,
    applied by :meth:`resolve_arguments` where the call leaves its arguments out): SIR's trains one round of a
    million simulations of its validated tau-leaping model (``task_options``: options of :func:`dpsbi.tasks.load` over
    the task's own for the model that simulates the training data; ``{}`` keeps the task's simulator), 13 000
    steps from lr 3e-3, over epsilon twice as far out as ``epsilon_range`` at each end (``epsilon_margin``):
    at the bar at its stored releases in three seeds, where the exact simulator's budget is not
    (docs/RESULTS.md, "SIR's amortized default"). The posterior then belongs to that model (its file names it).

    ``truncate=mass`` (a float, e.g. 1e-4) is the TSNPE variant (Deistler et al. 2022): later rounds draw
    from the prior restricted to the region where ``q(theta | y_obs)`` exceeds its ``mass``-quantile
    (estimated from ``truncation_draws`` posterior draws; at most ``max_prior_draws`` prior draws screened
    per round) and keep the first round's plain loss on all simulations: no atoms, ``atoms`` times fewer flow
    evaluations per step, no leakage; the posterior is valid inside that region. ``truncate=None`` (the default)
    is the task's own (:meth:`default_truncate`: SIR's and naive Bayes' 1e-4, atomic APT elsewhere);
    ``truncate=False`` is atomic APT on any task. See :class:`~dpsbi.inference.estimator.SequentialEstimator`
    for the common arguments.

    Defaults, from the accuracy-per-second frontier on one CPU core (docs/RESULTS.md, "Fast by default"): 10
    rounds of 1000 simulations (regression's sequential recipe: 2000; up to 100 000 with ``amortized=True``:
    :meth:`default_sims_per_round`), one
    plain-MC release per simulation at every step (an atomic step at M = 8 costs ~6x more and bought no accuracy
    per second there), 1000 gradient steps a round (SIR's sequential recipe: 2000) with a cosine
    learning rate from 1e-3. :meth:`paper` gives the paper's settings (M = 32 RQMC, open-ended rounds).
    """

    method = "SPPE"
    paper_settings = {**SequentialEstimator.paper_settings, "atoms": 10, "truncate": False}
    #: 1000 steps a round: an atomic M = 1 step is cheap (~36 ms), and on regression at epsilon 1 they reached
    #: C2ST 0.52 at 2000 simulations in 50 s where 500 steps needed 5000 simulations (docs/RESULTS.md).
    #: ``batch_size=None`` and ``weight_decay=None``: chosen per fit by :meth:`default_batch_size` (larger for an
    #: amortized fit) and :meth:`default_weight_decay` (none for an amortized fit).
    training_defaults = {"max_steps": 1000, "batch_size": None, "weight_decay": None}

    def __init__(
        self,
        task: Task,
        rounds: int | None = None,
        sims_per_round: int | None = None,
        inner_samples: int = 1,
        qmc: bool = False,
        atoms: int = 10,
        truncate: float | bool | None = None,
        truncation_draws: int = 100_000,
        max_prior_draws: int = 10_000_000,
        combined_loss: bool = False,
        widening: Widening | dict | bool | None = None,
        task_options: dict | None = None,
        **kwargs,
    ) -> None:
        task, self.task_options, rounds, sims_per_round, kwargs = self.resolve_arguments(
            task, task_options, rounds, sims_per_round, kwargs
        )
        super().__init__(task, rounds, sims_per_round, inner_samples, qmc, **kwargs)
        atoms = check_integer("atoms (atomic APT's contrasting parameters)", atoms, minimum=2)
        if atoms > min(self.training.batch_size, self.sims_per_round):
            raise ValueError(
                f"atoms={atoms} exceeds the batch size ({self.training.batch_size}) or sims_per_round ({self.sims_per_round})"
            )
        if truncate is None:
            truncate = self.default_truncate(self.amortized, bool(combined_loss), task)
        elif truncate is False:
            truncate = None
        if truncate is not None and not 0 < float(truncate) < 1:
            raise ValueError(
                f"truncate must be a posterior mass in (0, 1) (e.g. 1e-4), False (atomic APT) or None (the task's "
                f"default), got {truncate}"
            )
        if truncate is not None and self.amortized:
            raise ValueError(
                "truncate proposes inside the posterior at y_obs; amortized=True draws from the prior"
            )
        self.atoms = atoms
        self.truncate = None if truncate is None else float(truncate)
        self.truncation_draws = check_integer("truncation_draws", truncation_draws)
        self.max_prior_draws = check_integer("max_prior_draws", max_prior_draws)
        if combined_loss and (self.amortized or truncate is not None):
            raise ValueError(
                "combined_loss adds the plain loss to atomic rounds; amortized=True and truncate have none"
            )
        self.combined_loss = check_flag("combined_loss", combined_loss)
        self.widening = resolve_widening(
            widening, self.default_widening(self.amortized, task), self.amortized, task.mechanism
        )

    @classmethod
    def resolve_arguments(
        cls,
        task: Task,
        task_options: dict | None,
        rounds: int | None,
        sims_per_round: int | None,
        kwargs: dict,
    ) -> tuple[Task, dict, int, int, dict]:
        """The call's left-out arguments filled in: ``(task, task_options, rounds, sims_per_round, kwargs)``,
        from the task's recipe for the fit (:meth:`recipe`). An amortized recipe gives ``task_options`` (the task
        rebuilt with them: :func:`~dpsbi.tasks.with_options`) and its ``epsilon_margin`` where the call gives
        ``epsilon_range``; where the call leaves out both ``rounds`` and ``sims_per_round``, either recipe's
        ``rounds``, ``sims_per_round`` and ``training`` fields apply (under the call's ``training`` dict; a
        :class:`TrainingSettings` replaces them). Else :data:`ROUNDS` rounds and :meth:`default_sims_per_round`."""
        kwargs = dict(kwargs)
        amortized = bool(kwargs.get("amortized", False))
        recipe = cls.recipe(task, amortized)
        task_options = dict(recipe.get("task_options", {}) if task_options is None else task_options)
        task = with_options(task, task_options)
        if kwargs.get("epsilon_margin") is None and kwargs.get("epsilon_range") is not None:
            kwargs["epsilon_margin"] = recipe.get("epsilon_margin")
        if rounds is None and sims_per_round is None:
            rounds, sims_per_round = recipe.get("rounds"), recipe.get("sims_per_round")
            if "training" in recipe:
                training = {**cls.training_defaults, **recipe["training"]}
                kwargs["training"] = TrainingSettings.coerce(kwargs.get("training"), training)
        rounds = ROUNDS if rounds is None else rounds
        if sims_per_round is None:
            sims_per_round = cls.default_sims_per_round(amortized, task, rounds)
        return task, task_options, rounds, sims_per_round, kwargs

    @staticmethod
    def default_sims_per_round(amortized: bool, task: Task | None = None, rounds: int = ROUNDS) -> int:
        """``sims_per_round`` where the call leaves it out: 1000 for a fit at ``y_obs``; for an amortized fit of
        ``rounds`` rounds on ``task`` (required then), which must learn the posterior at every release and every
        epsilon of a range from prior draws alone, 100 000, or as many as keep the fit's stored parameters and
        statistics (the mechanism's input, ``input_dim`` a row) to :data:`AMORTIZED_STORED_NUMBERS` numbers,
        never under 10 000; 10 000 where ``task.costly_simulator``. Measured over 20 prior-predictive releases
        per epsilon (docs/RESULTS.md, "Simulations that are cheap: a million for an amortized fit"): ten times
        the simulations of the 10 000 a round before took naive Bayes over epsilon 1-10 from mean C2ST 0.543 /
        0.519 / 0.526 at epsilon 1.5 / 4 / 9 to 0.522 / 0.504 / 0.505 (57 of 60 releases closer): at 10 000 a
        round it fitted its simulations more closely than held-out ones, each seen ~100 times; 10 000 a round
        had taken it from 0.60-0.62 at 1000 ("Why the narrow end fell short, and the amortized defaults")."""
        if not amortized:
            return 1000
        if task is None:
            raise ValueError("the default sims_per_round of an amortized fit depends on its task")
        if task.costly_simulator:
            return 10_000
        fits = AMORTIZED_STORED_NUMBERS // (int(rounds) * (task.dim_theta + task.mechanism.input_dim))
        return min(100_000, max(10_000, fits))

    @staticmethod
    def recipe(task: Task, amortized: bool) -> dict:
        """The task's own recipe for the fit (``task.amortized_recipe`` or ``task.sequential_recipe``), its keys
        checked: a misspelt one would silently leave the fit on the generic defaults."""
        recipe, keys = (
            (task.amortized_recipe, AMORTIZED_RECIPE_KEYS)
            if amortized
            else (task.sequential_recipe, SEQUENTIAL_RECIPE_KEYS)
        )
        unknown = sorted(set(recipe) - keys)
        if unknown:
            kind = "amortized" if amortized else "sequential"
            raise ValueError(
                f"task {task.name!r}: its {kind}_recipe has unknown keys {unknown}; it takes {sorted(keys)}"
            )
        return recipe

    @classmethod
    def default_truncate(cls, amortized: bool, combined_loss: bool, task: Task) -> float | None:
        """``truncate`` where the call leaves it out: the ``truncate`` of the task's sequential recipe for a fit
        at ``y_obs`` without ``combined_loss`` (SIR and naive Bayes: 1e-4), else ``None``, atomic APT (an amortized
        fit draws from the prior). Measured on SIR at its stored releases at epsilon 0.1 / 1 / 10, three seeds each
        (docs/RESULTS.md, "Truncated proposals on SIR"): atomic APT's posterior sd ran 1.1-3.0x the reference's
        (leaked tails, at C2ST 0.52-0.58), truncated proposals' 0.89-1.11x at 0.1 and 1 and 1.03-1.42x at 10, in
        about two thirds of the CPU time; on naive Bayes at epsilon 10 (three seeds) C2ST 0.528-0.542 and sds
        0.95-1.10x in 332-336 CPU s, atomic APT 0.520-0.566 and 0.96-1.17x in 571-646 s ("Naive Bayes and
        regression: the atomic fits' spread"). Elsewhere atomic APT was faster to the bar (regression)."""
        return None if amortized or combined_loss else cls.recipe(task, False).get("truncate")

    @staticmethod
    def default_widening(amortized: bool, task: Task) -> bool:
        """``widening`` where the call leaves it out: on (:class:`~dpsbi.inference.widening.Widening`'s defaults)
        for an amortized fit of a task whose missed releases are far noise draws (``task.amortized_widening``:
        naive Bayes, whose one missed release of 60, C2ST 0.714-0.722 plain in three seeds, scores 0.565-0.574
        widened), if its mechanism allows it; off elsewhere: on regression over epsilon 0.1-10, whose worst
        releases lie in the prior's tails, widening moved epsilon 10's mean C2ST from 0.522 to 0.552 (docs/RESULTS.md,
        "Widened noise at the default")."""
        return bool(amortized and task.amortized_widening and widening_problem(task.mechanism) is None)

    @staticmethod
    def default_batch_size(amortized: bool, sims_per_round: int) -> int:
        """``training.batch_size`` where the call leaves it out: 100 for a fit at ``y_obs``; for an amortized fit a
        tenth of a round's simulations between 100 and 1000 (1000 at the amortized defaults of 10 000 and more a
        round).
        Measured over 20 prior-predictive releases per epsilon (docs/RESULTS.md, "Larger batches move the narrow
        end"): on regression over epsilon 0.1-10 batch 1000 took epsilon 10's mean C2ST from 0.565-0.575 to
        0.541-0.552 (3 seeds) at the same fit cost, 500 gave 0.554 and 3000 no more than 1000 for twice the fit;
        on census tables the worst release at rho 0.15 went from 0.62-0.72 to 0.59-0.66 (3 seeds); naive Bayes,
        the conjugate Gaussian and Poisson counts stayed where they were. An amortized fit with fewer simulations
        a round keeps a tenth of them a batch (ten steps to its first round's epoch), never under 100. SIR's flow
        lost at epsilon 0.1 (0.82-0.86 against 0.80, two seeds) and moved little elsewhere, for 1.5x its fit
        then (2146-2285 CPU s; 1481-1490 since its binomial noise got cheaper: docs/RESULTS.md, "The binomial
        quantile and SIR's amortized fit"): ``training=dict(batch_size=100)`` keeps the smaller batch."""
        smallest = TrainingSettings.batch_size
        return min(1000, max(smallest, sims_per_round // 10)) if amortized else smallest

    @staticmethod
    def default_weight_decay(amortized: bool) -> float:
        """``training.weight_decay`` where the call leaves it out: 1e-4 for a fit at ``y_obs``, 0 for an amortized
        one. Measured over 20 prior-predictive releases per epsilon (docs/RESULTS.md, "Weight decay and the
        narrow end"): on regression over epsilon 0.1-10, no decay took epsilon 10's mean C2ST from 0.541-0.552 to
        0.527-0.536 and its worst release from 0.633-0.694 to 0.596-0.630 (3 seeds; 45 of the 60 releases
        closer), epsilon 0.1 and 1, the conjugate Gaussian and Poisson counts unchanged; naive Bayes lost a little
        at epsilon 4 and 9 (mean +0.005 and +0.010, still 0.52-0.53), census tables at rho 0.15 +0.006. Adam
        divides the L2 term by each weight's gradient scale, so it pulls hardest on the weights that few releases
        move (a likely reason, not isolated)."""
        return 0.0 if amortized else TrainingSettings.weight_decay

    def options(self) -> dict:
        truncation = {
            "truncate": self.truncate,
            "truncation_draws": self.truncation_draws,
            "max_prior_draws": self.max_prior_draws,
        }
        return {
            "atoms": self.atoms,
            **(truncation if self.truncate is not None else {}),
            **({"combined_loss": True} if self.combined_loss else {}),
            **({"widening": self.widening.to_dict()} if self.widening is not None else {}),
            **({"task_options": self.task_options} if self.task_options else {}),
        }  # APT: as before TSNPE and the combined loss existed

    def flow_data(self, z, s, generator, epsilon=None):
        return z, self.context(self.releases(s, generator, epsilon), epsilon)

    def tensors(self, z: Tensor, s: Tensor, rounds: Tensor) -> tuple[Tensor, ...]:
        """``z``, ``s``, the prior log density of ``z`` and whether each row was drawn from the prior (the first
        round's: 1.0, else 0.0)."""
        return z, s, self.space.log_prior_z(z), (rounds == 1).to(z.dtype)

    def proposal_draws(self, round_index: int, posterior: Posterior, n: int, seed: int) -> Tensor:
        if self.truncate is None:
            return super().proposal_draws(round_index, posterior, n, seed)
        return truncated_prior_draws(
            self.task, posterior, n, self.truncate, self.truncation_draws, self.max_prior_draws, seed
        )

    def atoms_of(self, round_index: int) -> int:
        """The contrasting parameters per pair of the round at ``round_index``: 1 where it draws from the prior
        (the first round, ``truncate``, ``amortized``), else ``atoms``."""
        return 1 if round_index == 0 or self.truncate is not None or self.amortized else self.atoms

    def step_work(self, round_index: int) -> float:
        return super().step_work(round_index) * self.atoms_of(round_index)

    def loss(self, round_index: int) -> Loss:
        atoms = self.atoms_of(round_index)
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc
        if self.widening is not None:
            return self.widened_loss(posterior_log_prob)
        combined = self.combined_loss and atoms > 1

        def compute(flow, batch, draws):
            z, s, log_prior, prior_rows, *epsilon = batch  # epsilon: with epsilon_range
            u, *index = draws
            return sppe_loss(
                flow,
                z,
                s,
                mechanism,
                m,
                qmc,
                atoms=atoms,
                log_prior=log_prior,
                epsilon=epsilon[0] if epsilon else None,
                u=u,
                index=index[0] if index else None,
                prior_rows=prior_rows if combined else None,
            )

        def draw(rows: int, generator: torch.Generator) -> tuple[Tensor, ...]:
            u = noise_uniforms(rows, mechanism, m, qmc, generator)
            return (u, atom_indices(rows, min(atoms, rows), generator, u.device)) if atoms > 1 else (u,)

        return Loss(compute, draw)

    def posterior(self, round_index: int) -> FlowPosterior:
        return FlowPosterior(
            self.task,
            self._posterior_flow(),
            self.method,
            amortized=round_index == 0 or self.amortized,
            epsilon_range=self.epsilon_range,
            training_releases=self.training_releases(),
        )
