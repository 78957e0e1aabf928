"""The sweep's training runs (attnid.train.trainsweep): the copy task measured against everything its model cannot see."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnid.train import modelsym
from attnid.train import training as T
from attnid.train.trainsweep import TrainRun, _Trajectory, copy_invariants, run_training

COPY = TrainRun("copy", 16, (2, 12, 8), "sgd", 0.5, 12, 0, measure_every=4)


def test_exact_gradient_steps_have_no_part_along_anything_the_copy_model_cannot_see() -> None:
    result = run_training(COPY)
    assert [step for step, _ in result.shares] == [0, 4, 8]
    for _, shares in result.shares:
        assert {"total", "input", "output", "affine", "model"} <= set(shares)
        assert shares["model"] < 1e-10  # the loss's gradient is orthogonal to every invisible move, not only the orbit's
    assert result.tangent_dim < result.model_dim < result.parameters


def test_the_trajectory_gives_train_its_own_updates_back() -> None:
    # Adam moves along the orbit, so a step taken between the wrong points would show in the orbit share
    task = replace(COPY, optimiser="adam", lr=0.03, steps=9, measure_every=2)
    problem, spec = task.build(), task.spec()
    trajectory = _Trajectory(problem.loss, task.measure_every)
    history = T.train(replace(problem, loss=trajectory), optimiser="adam", lr=task.lr, steps=task.steps, seed=task.seed,
                      measure_every=task.measure_every)
    measured = trajectory.model_shares(history, spec)
    assert [s for s, _ in measured] == [s for s, _ in history.shares] == [0, 2, 4, 6, 8]  # step 8 ends at history.final
    for (step, own), (_, shares) in zip(history.shares, measured, strict=True):
        assert own["total"] > 0.05
        before = trajectory.points[step]
        recomputed = modelsym.model_shares(
            {n: p - T.attention_part(before)[n] for n, p in T.attention_part(trajectory.points.get(step + 1, history.final)).items()},
            T.attention_part(before), spec, *copy_invariants(before))
        assert recomputed["total"] == pytest.approx(own["total"], abs=1e-12)
        assert shares["model"] == recomputed["model"] >= own["total"]


def test_teacher_student_runs_are_measured_against_the_orbit_alone() -> None:
    result = run_training(TrainRun("teacher-student", 8, (2, 2, 0.0, "none"), "adam", 0.01, 3, 0, measure_every=1))
    assert result.model_dim is None and all("model" not in s for _, s in result.shares)


def test_copy_invariants_at_the_start_are_the_vocabulary_and_readout_null_spaces() -> None:
    params = COPY.build().init(0)
    input_null, output_null, normal = copy_invariants(params)
    assert (input_null.shape[1], output_null.shape[1]) == (8, 9) and normal is not None
    assert torch.allclose(params["embed"].double() @ normal, torch.ones(8, dtype=torch.float64))
    assert run_training(replace(COPY, steps=1, measure_every=0)).shares == ()
