"""The MiniLM fine-tuning runner (attnid.train.finetune): its task, its balanced start, and the theory's prediction
that a plain gradient step has no component along the orbit while an Adam step has one."""

from __future__ import annotations

import copy
import os
from collections import Counter

import pytest
import torch

from attnid.hf.checkpoint import CheckpointError
from attnid.hf.pretrained import pretrained_path
from attnid.hf.rebalance import representative
from attnid.train import finetune as ft

SMALL = {"classes": 4, "per_class": 12, "trained_layers": 1, "max_len": 16}


def _minilm() -> None:
    try:
        pretrained_path("minilm")
    except CheckpointError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.mark.slow
def test_the_task_splits_by_file_and_caps_each_class() -> None:
    train, val = ft.docstring_task(classes=5, per_class=50)
    assert train.classes == val.classes and len(train.classes) == 5
    assert not set(train.files) & set(val.files)  # a file's docstrings all go to one split
    counts = Counter(train.labels) + Counter(val.labels)
    assert set(counts) == set(range(5)) and max(counts.values()) <= 50
    for split in (train, val):  # every docstring comes from its class's subpackage
        assert all(f.split("/")[0] == split.classes[lab] for f, lab in zip(split.files, split.labels, strict=True))
    assert (train, val) == ft.docstring_task.__wrapped__(classes=5, per_class=50)  # the same on a fresh call


@pytest.mark.real_model
def test_the_balanced_start_computes_the_same_function() -> None:
    _minilm()
    setup = ft._setup(SMALL["classes"], SMALL["per_class"], SMALL["trained_layers"], SMALL["max_len"])
    first = setup.model.config.num_hidden_layers - 1
    layers = torch.nn.ModuleList([setup.model.encoder.layer[first]])
    moved = torch.nn.ModuleList([copy.deepcopy(setup.model.encoder.layer[first])])
    params = ft._attention(setup, moved, first)[0]
    balanced = representative(params, setup.checkpoint.specs[first])[0]
    ft._load_attention(setup, moved[0], first, balanced)
    assert not torch.equal(moved[0].attention.self.query.weight, layers[0].attention.self.query.weight)
    head = torch.nn.Linear(384, SMALL["classes"])
    with torch.no_grad():
        a = ft._logits(layers, head, setup.train.states, setup.train.mask)
        b = ft._logits(moved, head, setup.train.states, setup.train.mask)
    assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max())


@pytest.mark.real_model
def test_a_gradient_step_is_orthogonal_to_the_orbit_and_an_adam_step_is_not() -> None:
    _minilm()
    runs = {opt: ft.run_finetune(ft.FineTuneRun(seed=0, optimiser=opt, lr=lr, steps=3, batch=8, eval_every=3,
                                                shares_every=1, **SMALL))
            for opt, lr in (("sgd", 0.1), ("adamw", 1e-3))}
    sgd = max(s["total"] for _, _, s in runs["sgd"].shares)
    adam = min(s["total"] for _, _, s in runs["adamw"].shares)
    assert sgd < 1e-4  # float32 round-off of the step; the exact gradient is orthogonal to the orbit
    assert adam > 0.01
    assert len(runs["sgd"].val_loss) == 1 and len(runs["sgd"].net_shares) == 1


def test_the_tuning_score_is_the_mean_of_the_last_evaluations() -> None:
    history = ft.FineTuneHistory(val_loss=[2.0, 1.5, 1.25, 0.75])
    assert ft.tuning_score(history) == pytest.approx(1.0)
    assert ft.tuning_score(history, last=3) == pytest.approx(3.5 / 3)
    with pytest.raises(ValueError, match="at least 5 evaluations"):
        ft.tuning_score(history, last=5)
    with pytest.raises(ValueError, match="last >= 1"):
        ft.tuning_score(history, last=0)
