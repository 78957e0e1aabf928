"""The synthetic training experiments' runs as tasks of a sweep: a picklable description and one runner.

``TrainRun`` names a run of ``attnid.training.train`` completely (problem, layout, optimiser, rate,
steps, seed, dtype, what to measure) in plain values, so ``attnid.sweep.run_sweep`` can hand it to a
worker process or a Dask worker; ``run_training`` builds the problem there and returns a
``TrainResult`` of plain values. A run depends on its task alone, so the data a sweep writes do not
depend on the number or kind of workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import symmetry as sym
from . import training as T
from .spec import AttentionSpec

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


def run_training(task: TrainRun) -> TrainResult:
    """``training.train`` for one ``TrainRun`` (a module-level function, so a sweep's workers can import it)."""
    problem, spec = task.build(), task.spec()
    start = problem.init(task.seed)
    attention = {n: p.double().cpu() for n, p in T.attention_part(start).items()}
    history = T.train(problem, optimiser=task.optimiser, lr=task.lr, steps=task.steps, seed=task.seed,
                      gradient=task.gradient, weight_decay=task.weight_decay, measure_every=task.measure_every)
    return TrainResult(
        tangent_dim=int(sym.orbit_tangent(attention, spec).shape[1]), parameters=sum(p.numel() for p in attention.values()),
        loss=tuple(history.loss), shares=tuple(history.shares),
        drift=tuple(history.drift[-1]) if history.drift else (float("nan"), float("nan")),
        key_bias=tuple(history.key_bias), start_key_bias=_flat(start, T.ATTENTION_PREFIX + "b_K"),
        final_key_bias=_flat(history.final, T.ATTENTION_PREFIX + "b_K"), diverged=history.diverged)
