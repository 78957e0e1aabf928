"""The synthetic training experiments' runs as tasks of a sweep: a picklable description and one runner.

``TrainRun`` names a run of ``attnid.train.training.train`` completely (problem, layout, optimiser, rate,
steps, seed, dtype, what to measure) in plain values, so ``attnid.train.sweep.run_sweep`` can hand it to a
worker process or a Dask worker; ``run_training`` builds the problem there and returns a
``TrainResult`` of plain values. A run depends on its task alone, so the data a sweep writes do not
depend on the number or kind of workers.

The copy task's runs are also measured against everything its model cannot see, not only the
layer's orbit (``copy_invariants``, ``attnid.train.modelsym``): the measured steps' updates are taken from
the points the loss is evaluated at (``_Trajectory``), so ``training.train`` itself is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from attnid.train import modelsym
from attnid.train import training as T
from attnid.spec import AttentionSpec, Params

PROBLEMS = ("teacher-student", "copy")


@dataclass(frozen=True)
class TrainRun:
    """One training run. ``layout``: the student [heads, kv_heads, rope_fraction, bias] of a teacher-student
    problem, or (heads, sequence length, vocabulary) of the copy task. ``extra``: further fields of the
    student's AttentionSpec as (name, value) pairs (for instance (("norm", "sink"),))."""

    problem: str
    d_model: int
    layout: tuple
    optimiser: str
    lr: float
    steps: int
    seed: int
    dtype: str = "float64"
    gradient: str = "loss"
    weight_decay: float = 0.0
    measure_every: int = 0
    teacher_heads: int = 2
    extra: tuple = ()
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.problem not in PROBLEMS:
            raise ValueError(f"problem must be one of {', '.join(PROBLEMS)}; got {self.problem!r}")
        if self.problem == "copy" and len(self.layout) != 3:
            raise ValueError(f"a copy task's layout is (heads, sequence length, vocabulary), got {self.layout!r}")

    def spec(self) -> AttentionSpec:
        """The measured attention layer's layout."""
        if self.problem == "copy":
            return AttentionSpec.create(self.d_model, self.layout[0], causal=True, rope_fraction=1.0, **dict(self.extra))
        return T.student_spec(self.d_model, list(self.layout), **dict(self.extra))

    def build(self) -> T.Problem:
        """The problem, as ``training.teacher_student`` or ``training.copy_task`` makes it for this seed."""
        dtype, backend = T.precision(self.dtype, torch.device(self.device))
        spec = self.spec()
        if self.problem == "copy":
            return T.copy_task(spec, seq_len=self.layout[1], vocab=self.layout[2], seed=self.seed, dtype=dtype,
                               device=self.device, backend=backend)
        teacher = AttentionSpec.create(self.d_model, self.teacher_heads)
        return T.teacher_student(teacher, spec, seed=self.seed, dtype=dtype, device=self.device, backend=backend)


@dataclass(frozen=True)
class TrainResult:
    """What a run gives the experiments: the orbit's size at the start and ``training.History`` in plain values."""

    tangent_dim: int  # u: the orbit tangent's dimension at the initial point
    model_dim: int | None  # the dimension of all the model cannot see there (copy task), None where that is the orbit
    parameters: int  # P: the measured layer's parameter count
    loss: tuple[float, ...]
    shares: tuple[tuple[int, dict[str, float]], ...]
    drift: tuple[float, float]  # the conserved quantities' drift after the last step
    key_bias: tuple[float, ...]  # ||b_K|| after every step (nan without b_K)
    start_key_bias: tuple[float, ...]  # b_K at the start and at the end, flattened (empty without b_K)
    final_key_bias: tuple[float, ...]
    diverged: int | None


def _flat(params: dict[str, torch.Tensor], name: str) -> tuple[float, ...]:
    return tuple(params[name].detach().cpu().double().reshape(-1).tolist()) if name in params else ()


def copy_invariants(params: Params) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(input_null, output_null, normal) of ``modelsym`` for the copy task at a point (all its parameters).

    The layer reads rows of the embedding E only, so its inputs span E's row space and lie on the
    hyperplane x . a = 1 when E's rows are independent; its output reaches the loss only through
    the unembedding U, up to the constant softmax cross-entropy ignores. Measured at the point with
    the rank rule of ``attnid.rank``: the directions change as E and U train.
    """
    embed, unembed = params["embed"].detach().double().cpu(), params["unembed"].detach().double().cpu()
    return modelsym.complement(embed), modelsym.blind_readout(unembed), modelsym.affine_normal(embed)


class _Trajectory:
    """A problem's loss that keeps a float64 copy of the point it is evaluated at, for the steps whose update is measured.

    ``training.train`` evaluates the loss once per step, at the point before the step, so the point
    of call k is theta_k and update k is theta_{k+1} - theta_k (the last one ends at
    ``history.final``). Only the calls k with k or k - 1 a multiple of ``every`` are kept.
    """

    def __init__(self, loss, every: int) -> None:
        self.loss, self.every, self.calls, self.points = loss, every, 0, {}

    def __call__(self, params: Params) -> torch.Tensor:
        k, self.calls = self.calls, self.calls + 1
        if k % self.every == 0 or (k - 1) % self.every == 0:
            self.points[k] = {n: p.detach().double().cpu().clone() for n, p in params.items()}
        return self.loss(params)

    def model_shares(self, history: T.History, spec: AttentionSpec) -> list[tuple[int, dict[str, float]]]:
        """The shares ``train`` would record every ``every`` steps (it ran with measure_every=0), with the model's kinds
        and 'model' added (``modelsym.model_shares``: orbit and moves from one Gram matrix, in float64)."""
        final = {n: p.double().cpu() for n, p in history.final.items()}
        done = len(history.loss) if history.diverged is None else history.diverged  # the steps that made an update
        out = []
        for step in range(0, done, self.every):
            before, after = self.points[step], self.points.get(step + 1, final)
            attention = T.attention_part(before)
            update = {n: p - attention[n] for n, p in T.attention_part(after).items()}
            out.append((step, modelsym.model_shares(update, attention, spec, *copy_invariants(before))))
        return out


def run_training(task: TrainRun) -> TrainResult:
    """``training.train`` for one ``TrainRun`` (a module-level function, so a sweep's workers can import it)."""
    problem, spec = task.build(), task.spec()
    start = problem.init(task.seed)
    attention = {n: p.double().cpu() for n, p in T.attention_part(start).items()}
    model = task.problem == "copy"  # teacher-student: the loss reads every output, Gaussian inputs span R^d
    if model and task.measure_every:
        trajectory = _Trajectory(problem.loss, task.measure_every)
        problem = replace(problem, loss=trajectory)
    measured_here = model and task.measure_every  # the model's shares include the orbit's: measured once, below
    history = T.train(problem, optimiser=task.optimiser, lr=task.lr, steps=task.steps, seed=task.seed,
                      gradient=task.gradient, weight_decay=task.weight_decay,
                      measure_every=0 if measured_here else task.measure_every)
    shares = trajectory.model_shares(history, spec) if measured_here else history.shares
    model_dim = modelsym.model_dimensions(attention, spec, *copy_invariants(start))["model"] if model else None
    return TrainResult(
        tangent_dim=T.orbit_parts(attention, spec)[0].dimension(), model_dim=model_dim,
        parameters=sum(p.numel() for p in attention.values()), loss=tuple(history.loss), shares=tuple(shares),
        drift=tuple(history.drift[-1]) if history.drift else (float("nan"), float("nan")),
        key_bias=tuple(history.key_bias), start_key_bias=_flat(start, T.ATTENTION_PREFIX + "b_K"),
        final_key_bias=_flat(history.final, T.ATTENTION_PREFIX + "b_K"), diverged=history.diverged)
