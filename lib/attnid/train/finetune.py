"""Fine-tuning a trained transformer on CPU: all-MiniLM-L6-v2 learns which SymPy subpackage a docstring is from.

The task (``docstring_task``): the first paragraph of every function and class docstring of the pinned
``sympy`` package (test and benchmark folders left out), labelled by its top-level subpackage; the
``classes`` subpackages with the most docstrings, at most ``per_class`` docstrings each (a fixed, hashed
choice). A file's docstrings all go to one split: validation when the SHA-256 of its path is 0 mod
``VAL_EVERY``, so no near-copy of a training docstring sits in validation.

The model: the pinned checkpoint, its lower layers frozen. Their outputs are computed once
(``frozen_features``), and a run trains the top ``trained_layers`` BERT layers, transformers' own
modules, and a linear head on the mean of the token states. ``run_finetune`` records the validation
loss and accuracy, the invisible shares of each measured step's attention update (``attnid.train.tangent``,
in the tangent space of the layer's orbit at the step's start), the share of the whole run's
update at the starting point, and each head's balance at the start and the end. The arm 'balanced'
starts from the balanced representative of ``attnid rebalance`` (the same function, proved in the
chapter "Trained models"); 'original' from the weights as trained.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from attnid.hf.atpoint import balance_figures
from attnid.hf.checkpoint import Checkpoint, open_checkpoint
from attnid.hf.pretrained import pretrained_path
from attnid.hf.rebalance import representative
from attnid.spec import Params
from attnid.train import tangent
from attnid.train.textmodel import package_sources
from attnid.train.training import make_optimiser
from attnid.runtime import check_seed

VAL_EVERY = 5
ARMS = ("original", "balanced")
SKIPPED_FOLDERS = ("tests", "benchmarks")


@dataclass(frozen=True)
class Docstrings:
    """One split of the task: texts, their labels (indices into ``classes``) and the files they come from."""

    texts: tuple[str, ...]
    labels: tuple[int, ...]
    files: tuple[str, ...]
    classes: tuple[str, ...]


def first_paragraphs(package: str = "sympy", min_chars: int = 20) -> list[tuple[str, str, str]]:
    """(subpackage, file, paragraph) for every function and class docstring of ``package`` outside its tests.

    The paragraph is the docstring's first block of lines, whitespace collapsed, kept when it has
    ``min_chars`` characters or more. Files in the package's top folder have no subpackage and are left out.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"no installed package {package!r} with a source folder")
    root = Path(next(iter(spec.submodule_search_locations)))
    rows = []
    for path in package_sources(package):
        rel = path.relative_to(root).parts
        if len(rel) < 2 or any(folder in rel for folder in SKIPPED_FOLDERS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                paragraph = " ".join(doc.strip().split("\n\n")[0].split()) if doc else ""
                if len(paragraph) >= min_chars:
                    rows.append((rel[0], Path(*rel).as_posix(), paragraph))
    return rows


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@lru_cache(maxsize=2)
def docstring_task(classes: int = 8, per_class: int = 300, package: str = "sympy") -> tuple[Docstrings, Docstrings]:
    """(training, validation) splits of the task in the module docstring, the same on every machine."""
    if classes < 2 or per_class < 1:
        raise ValueError(f"need classes >= 2 and per_class >= 1, got {classes} and {per_class}")
    rows = first_paragraphs(package)
    counts = Counter(sub for sub, _, _ in rows)
    names = tuple(sorted(counts, key=lambda s: (-counts[s], s))[:classes])
    chosen = []
    for label, name in enumerate(names):
        mine = sorted((r for r in rows if r[0] == name), key=lambda r: (_digest(r[1] + "\n" + r[2]), r[1], r[2]))
        chosen += [(label, f, text) for _, f, text in mine[:per_class]]
    chosen.sort(key=lambda r: (r[1], r[2]))
    splits = []
    for is_val in (False, True):
        part = [r for r in chosen if (_digest(r[1]) % VAL_EVERY == 0) == is_val]
        splits.append(Docstrings(tuple(t for _, _, t in part), tuple(lab for lab, _, _ in part),
                                 tuple(f for _, f, _ in part), names))
    return splits[0], splits[1]


@dataclass(frozen=True)
class Features:
    """The frozen layers' output for one split: states (N, T, d), token mask (N, T), labels (N,)."""

    states: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor


def frozen_features(model: torch.nn.Module, tokenizer, split: Docstrings, trained_layers: int, max_len: int,
                    chunk: int = 128) -> Features:
    """The input of the top ``trained_layers`` layers of a BertModel for every text of ``split`` (no gradient)."""
    enc = tokenizer(list(split.texts), padding="max_length", truncation=True, max_length=max_len, return_tensors="pt")
    depth = model.config.num_hidden_layers - trained_layers
    states = []
    with torch.no_grad():
        for start in range(0, len(split.texts), chunk):
            part = {k: v[start:start + chunk] for k, v in enc.items()}
            states.append(model(**part, output_hidden_states=True).hidden_states[depth])
    return Features(torch.cat(states), enc["attention_mask"].to(states[0].dtype), torch.tensor(split.labels))


@dataclass(frozen=True)
class FineTuneRun:
    """One run, picklable: the optimiser and its rate, the starting arm, the seed and the schedule."""

    seed: int
    """Seeds the head's initialisation and the batches."""
    optimiser: str
    """A name ``attnid.train.training.make_optimiser`` knows ('adamw', 'sgd', ...)."""
    lr: float
    arm: str = "original"
    """'original': the weights as trained; 'balanced': their balanced representative (the same function)."""
    weight_decay: float = 0.0
    steps: int = 100
    batch: int = 16
    eval_every: int = 25
    """Validation loss and accuracy after every ``eval_every`` steps and after the last."""
    shares_every: int = 10
    """The invisible shares of the step's attention update at every ``shares_every``-th step (from step 0)."""
    trained_layers: int = 1
    classes: int = 8
    per_class: int = 300
    max_len: int = 24
    """Tokens per docstring, [CLS] and [SEP] included (longer ones are truncated)."""

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {', '.join(ARMS)}; got {self.arm!r}")
        if min(self.steps, self.batch, self.eval_every, self.shares_every, self.trained_layers) < 1:
            raise ValueError("steps, batch, eval_every, shares_every and trained_layers must be >= 1")


@dataclass
class FineTuneHistory:
    """What a run records (see the module docstring); shares are (step, layer, {part: share})."""

    eval_steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    shares: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)
    net_shares: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    balance: list[tuple[str, int, int, float, float]] = field(default_factory=list)  # (when, layer, group, QK, VO ratio)


def tuning_score(history: FineTuneHistory, last: int = 2) -> float:
    """The mean validation loss of a run's ``last`` evaluations: what the rate tuning minimises (one
    evaluation on a few hundred docstrings after a noisy last batch is a noisy score)."""
    if last < 1 or len(history.val_loss) < last:
        raise ValueError(f"need at least {last} evaluations (last >= 1), the run has {len(history.val_loss)}")
    return sum(history.val_loss[-last:]) / last


@dataclass(frozen=True)
class _Setup:
    checkpoint: Checkpoint
    model: torch.nn.Module
    train: Features
    val: Features


@lru_cache(maxsize=1)
def _setup(classes: int, per_class: int, trained_layers: int, max_len: int) -> _Setup:
    """The pinned model, its checkpoint view and both splits' frozen features, once per process."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = pretrained_path("minilm")
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    train, val = docstring_task(classes, per_class)
    feats = [frozen_features(model, tokenizer, s, trained_layers, max_len) for s in (train, val)]
    return _Setup(open_checkpoint(folder), model, *feats)


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return (1.0 - mask[:, None, None, :]) * torch.finfo(mask.dtype).min


def _logits(layers: torch.nn.ModuleList, head: torch.nn.Linear, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h, additive = states, _additive(mask)
    for layer in layers:
        out = layer(h, attention_mask=additive)
        h = out[0] if isinstance(out, tuple) else out
    pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return head(pooled)


def _evaluate(layers: torch.nn.ModuleList, head: torch.nn.Linear, data: Features, chunk: int = 256) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on ``data``."""
    total, right = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(data.labels), chunk):
            logits = _logits(layers, head, data.states[s:s + chunk], data.mask[s:s + chunk])
            y = data.labels[s:s + chunk]
            total += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            right += int((logits.argmax(1) == y).sum())
    return total / len(data.labels), right / len(data.labels)


def _attention(setup: _Setup, layers: torch.nn.ModuleList, first: int) -> list[Params]:
    """Each trained layer's attention in attnid's layout (float64), read through the checkpoint's names."""
    prefix = "encoder.layer.{}."
    out = []
    for j, layer in enumerate(layers):
        i = first + j
        state = {prefix.format(i) + name: t for name, t in layer.state_dict().items()}
        out.append(setup.checkpoint.layer(i, state))
    return out


def _load_attention(setup: _Setup, layer: torch.nn.Module, i: int, params: Params) -> None:
    """Write attnid-layout attention parameters into a BertLayer (the inverse of ``_attention``)."""
    names = setup.checkpoint.tensors(i, params)
    start = f"{setup.checkpoint.prefix}encoder.layer.{i}."
    with torch.no_grad():
        own = dict(layer.named_parameters())
        for name, value in names.items():
            own[name.removeprefix(start)].copy_(value.to(own[name.removeprefix(start)].dtype))


def _record_balance(history: FineTuneHistory, when: str, setup: _Setup, attn: list[Params], first: int) -> None:
    for j, params in enumerate(attn):
        figures = balance_figures(params, setup.checkpoint.specs[first + j])
        pairs = zip(figures["query_key_norm_ratio"], figures["value_output_norm_ratio"], strict=True)
        for g, (qk, vo) in enumerate(pairs):
            history.balance.append((when, first + j, g, qk, vo))


def run_finetune(run: FineTuneRun) -> FineTuneHistory:
    """Fine-tune the top layers and a head from ``run``'s arm; see the module docstring for what is recorded."""
    setup = _setup(run.classes, run.per_class, run.trained_layers, run.max_len)
    first = setup.model.config.num_hidden_layers - run.trained_layers
    layers = torch.nn.ModuleList(copy.deepcopy(setup.model.encoder.layer[first:])).eval()  # no dropout
    for p in layers.parameters():
        p.requires_grad_(True)
    if run.arm == "balanced":
        for j, params in enumerate(_attention(setup, layers, first)):
            _load_attention(setup, layers[j], first + j, representative(params, setup.checkpoint.specs[first + j])[0])
    gen = torch.Generator().manual_seed(run.seed)
    head = torch.nn.Linear(setup.train.states.shape[-1], run.classes)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) / head.weight.shape[1] ** 0.5)
        head.bias.zero_()
    opt = make_optimiser(run.optimiser, [*layers.parameters(), *head.parameters()], run.lr, run.weight_decay)
    history = FineTuneHistory()
    start = _attention(setup, layers, first)
    _record_balance(history, "start", setup, start, first)
    running: list[float] = []
    n = len(setup.train.labels)
    for step in range(run.steps):
        rows = torch.randint(0, n, (run.batch,), generator=gen)
        logits = _logits(layers, head, setup.train.states[rows], setup.train.mask[rows])
        loss = torch.nn.functional.cross_entropy(logits, setup.train.labels[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        running.append(float(loss.detach()))
        measure = step % run.shares_every == 0
        before = _attention(setup, layers, first) if measure else None
        opt.step()
        if before is not None:
            for j, (old, new) in enumerate(zip(before, _attention(setup, layers, first), strict=True)):
                update = {k: new[k] - old[k] for k in old}
                history.shares.append((step, first + j, tangent.shares(update, old, setup.checkpoint.specs[first + j])))
        if (step + 1) % run.eval_every == 0 or step + 1 == run.steps:
            loss_val, accuracy = _evaluate(layers, head, setup.val)
            history.eval_steps.append(step + 1)
            history.train_loss.append(sum(running) / len(running))
            history.val_loss.append(loss_val)
            history.val_accuracy.append(accuracy)
            running = []
    end = _attention(setup, layers, first)
    for j, (old, new) in enumerate(zip(start, end, strict=True)):
        net = {k: new[k] - old[k] for k in old}
        history.net_shares.append((first + j, tangent.shares(net, old, setup.checkpoint.specs[first + j])))
    _record_balance(history, "end", setup, end, first)
    return history
