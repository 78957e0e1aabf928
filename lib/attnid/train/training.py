"""Training experiments: how much of each update moves along the invisible directions, and rebalancing.

Two problems, both with an attention layer of a given layout inside:

* ``teacher_student``: a random teacher layer labels random sequences; a student layer (same
  or larger layout) fits them by mean squared error, normalised by the targets' mean square.
* ``copy_task``: a one-layer model (embedding, one attention layer with a residual connection,
  unembedding) learns to output the previous token: a task with structure that needs positions
  (causal attention, RoPE) to be solved.

``train`` runs an optimiser (SGD, SGD with momentum, Adam, AdamW) and, at each step, measures
the share of the attention layer's update that lies in the tangent space of its symmetry orbit
(``invisible_shares``), the drift of the conserved quantities, and the key bias. It can also
rebalance: project every update off the tangent space ('project'), or move the parameters
along the orbit to its balanced point every few steps ('balance').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnid import balancing as bal

from attnid import symmetry as sym
from attnid.jacobian import flatten
from attnid.layer import forward, init_params
from attnid.train.spans import SpanFamily, stack
from attnid.spec import AttentionSpec, Params

OPTIMISERS = ("sgd", "momentum", "adam", "adamw")
REBALANCING = ("none", "project", "balance")
GRADIENTS = ("loss", "random")
MOMENTUM = 0.9
ATTENTION_PREFIX = "attn."


@dataclass(frozen=True)
class Problem:
    """A loss of named parameters; ``attention_part`` picks out the layer whose orbit is measured."""

    name: str
    spec: AttentionSpec
    init: Callable[[int], dict[str, torch.Tensor]]
    loss: Callable[[Params], torch.Tensor]


def attention_part(params: Params) -> dict[str, torch.Tensor]:
    """The entries of ``params`` named 'attn.*', without the prefix: the measured attention layer."""
    return {name.removeprefix(ATTENTION_PREFIX): p for name, p in params.items() if name.startswith(ATTENTION_PREFIX)}


def _prefixed(params: Params) -> dict[str, torch.Tensor]:
    return {ATTENTION_PREFIX + name: p for name, p in params.items()}


DTYPES = {"float64": torch.float64, "float32": torch.float32}


def student_spec(d_model: int, entry: list | tuple, **extra) -> AttentionSpec:
    """A student layout from the chapters' compact form [heads, kv_heads, rope_fraction, bias]."""
    if len(entry) != 4:
        raise ValueError(f"a student is [heads, kv_heads, rope_fraction, bias], got {entry!r}")
    heads, kv_heads, rope, bias = entry
    return AttentionSpec.create(d_model, heads, kv_heads=kv_heads, rope_fraction=rope, bias=bias, **extra)


def precision(dtype_name: str, device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, backend) for a run: float32 on CUDA goes through the Triton kernels, everything else the reference."""
    if dtype_name not in DTYPES:
        raise ValueError(f"DTYPE must be one of {sorted(DTYPES)}, got {dtype_name!r}")
    dtype = DTYPES[dtype_name]
    return dtype, "kernels" if device.type == "cuda" and dtype == torch.float32 else "reference"


def teacher_student(
    teacher: AttentionSpec, student: AttentionSpec, *, n_sequences: int = 64, seq_len: int = 8, seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu", backend: str = "reference",
    imbalance: float = 1.0,
) -> Problem:
    """Student layer fitting a random teacher layer on random Gaussian sequences (fixed data set of the seed).

    ``imbalance`` c moves the student's initial point along its orbit by M = N = c I: W_Q, W_V
    (and b_Q, b_V) times c, W_K, W_O (and b_K) over c. The initial function is the same for every c;
    only the parametrisation is less balanced.
    """
    if teacher.d_model != student.d_model:
        raise ValueError(f"teacher and student need the same d_model; got {teacher.d_model} and {student.d_model}")
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(n_sequences, seq_len, teacher.d_model, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = forward(init_params(teacher, gen), x, teacher)
    x, y = x.to(device, dtype), y.to(device, dtype)
    scale = y.pow(2).mean()

    def loss(params: Params) -> torch.Tensor:
        return (forward(attention_part(params), x, student, backend=backend) - y).pow(2).mean() / scale

    if not imbalance > 0:
        raise ValueError(f"imbalance must be positive, got {imbalance!r}")

    def init(init_seed: int) -> dict[str, torch.Tensor]:
        params = init_params(student, torch.Generator().manual_seed(init_seed))
        if imbalance != 1.0:
            eye_k = torch.eye(student.head_dim, dtype=torch.float64).expand(student.kv_heads, -1, -1)
            eye_v = torch.eye(student.v_head_dim, dtype=torch.float64).expand(student.kv_heads, -1, -1)
            params = sym.apply_group(params, student, sym.GroupElement(imbalance * eye_k, imbalance * eye_v))
        return _prefixed({n: p.to(device, dtype) for n, p in params.items()})

    return Problem(f"teacher {teacher.describe()} -> student {student.describe()}", student, init, loss)


def copy_task(
    spec: AttentionSpec, *, vocab: int = 8, n_sequences: int = 64, seq_len: int = 12, seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu", backend: str = "reference",
) -> Problem:
    """Predict the previous token: logits_i = (E x_i + attn(E x)_i) U, cross-entropy against x_{i-1}, i >= 1."""
    if not spec.causal:
        raise ValueError("the copy task reads earlier tokens only: use a causal layout (causal=True)")
    gen = torch.Generator().manual_seed(20_000 + seed)
    tokens = torch.randint(0, vocab, (n_sequences, seq_len), generator=gen).to(device)
    d = spec.d_model

    def loss(params: Params) -> torch.Tensor:
        h = params["embed"][tokens]
        logits = (h + forward(attention_part(params), h, spec, backend=backend)) @ params["unembed"]
        return F.cross_entropy(logits[:, 1:].reshape(-1, vocab), tokens[:, :-1].reshape(-1))

    def init(init_seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(init_seed)
        params = {"embed": torch.randn(vocab, d, generator=g, dtype=torch.float64),
                  "unembed": torch.randn(d, vocab, generator=g, dtype=torch.float64) * d**-0.5}
        params = {n: p.to(device, dtype) for n, p in params.items()}
        return {**params, **_prefixed(init_params(spec, g, dtype, device))}

    return Problem(f"copy the previous token, {spec.describe()}", spec, init, loss)


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------

KINDS = ("query_key", "value_output", "key_bias", "value_bias")


def invisible_shares(update: Params, attention: Params, spec: AttentionSpec) -> dict[str, float]:
    """||P u|| / ||u|| for the update u of the attention layer, P the projection onto (part of) the orbit tangent at ``attention``.

    Keys: 'total' (the whole tangent space), each kind in KINDS present in this layout (all
    groups together), and each labelled part 'kind/g'. 1 for u inside the space, 0 for u
    orthogonal to it. A zero update has share 0. Every span is orthonormalised under the rank
    rule by ``attnid.train.spans`` (its basis is never formed).
    """
    return part_shares(flatten(update), *orbit_parts(attention, spec))


Parts = dict[str, list[int] | None]  # share key -> the columns of the orbit's directions it spans (None: all)


def orbit_part_columns(labelled: list[tuple[str, Params]]) -> Parts:
    """Per key of ``invisible_shares``, the columns of the labelled tangent directions its span uses ('total': all)."""
    parts: Parts = {"total": None}
    for column, (label, _) in enumerate(labelled):
        parts.setdefault(label.split("/")[0], []).append(column)  # type: ignore[union-attr]
        if "/" in label:
            parts.setdefault(label, []).append(column)  # type: ignore[union-attr]
    return parts


def orbit_parts(attention: Params, spec: AttentionSpec) -> tuple[SpanFamily, Parts]:
    """The orbit's tangent directions at ``attention`` as a ``SpanFamily``, with ``orbit_part_columns``."""
    labelled = sym.labelled_tangent_directions(attention, spec)
    return SpanFamily(stack([d for _, d in labelled], attention)), orbit_part_columns(labelled)


def part_shares(update: torch.Tensor, family: SpanFamily, parts: Parts) -> dict[str, float]:
    """||B_S^T u|| / ||u|| for each part S of ``family`` (u flat; 0 for a zero update)."""
    norm = update.norm()
    if not norm > 0:
        return dict.fromkeys(parts, 0.0)
    at = family.transpose_times(update)
    return {key: float(family.coordinates(at, index).norm() / norm) for key, index in parts.items()}


def conservation_drift(start: tuple[torch.Tensor, torch.Tensor], now: tuple[torch.Tensor, torch.Tensor], size: float) -> tuple[float, float]:
    """(||C_QK(t) - C_QK(0)||, ||C_VO(t) - C_VO(0)||) in Frobenius norm, divided by ``size`` (the layer's squared norm at t = 0)."""
    return tuple(float((b - a).norm() / size) for a, b in zip(start, now, strict=True))  # type: ignore[return-value]


def squared_norm(params: Params) -> float:
    return float(sum((p.detach() ** 2).sum() for p in params.values()))


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------


def make_optimiser(name: str, params: list[torch.Tensor], lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """SGD, SGD with momentum 0.9, Adam (L2 penalty in the gradient) or AdamW (decoupled decay)."""
    if name not in OPTIMISERS:
        raise ValueError(f"optimiser must be one of {', '.join(OPTIMISERS)}; got {name!r}")
    if not lr > 0:
        raise ValueError(f"learning rate must be positive, got {lr!r}")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


@dataclass
class History:
    """What ``train`` records: one entry per step (shares only at measured steps)."""

    loss: list[float] = field(default_factory=list)
    shares: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    drift: list[tuple[float, float]] = field(default_factory=list)
    key_bias: list[float] = field(default_factory=list)
    final: dict[str, torch.Tensor] = field(default_factory=dict)
    diverged: int | None = None  # the step where the run stopped (see ``train``), None if it ran to the end


def train(
    problem: Problem, *, optimiser: str, lr: float, steps: int, seed: int, weight_decay: float = 0.0,
    rebalance: str = "none", balance_every: int = 25, measure_every: int = 0, progress: bool = False,
    gradient: str = "loss", transport_state: bool = False,
) -> History:
    """Run ``steps`` full-batch steps from ``problem.init(seed)``; see the module docstring.

    rebalance: 'none'; 'project' (after each step, remove from the attention layer's update its
    component along the orbit tangent at the pre-step point); 'balance' (every ``balance_every``
    steps, move the layer to the balanced point of its orbit: same function, optimiser state
    kept as is, or transported with ``transport_state``). measure_every: record the invisible
    shares every so many steps (0: never). Loss, conservation drift and the key bias's norm are
    recorded at every step. A run whose loss or parameters stop being finite stops there and
    records the step in ``history.diverged``; so does a balanced run whose factors have collapsed
    so far that no balanced point exists (a singular Gram matrix: ``bal.SingularGramError``),
    which happens only after the parameters have grown by many orders of magnitude.

    gradient: 'loss' (the loss's gradient) or 'random' (every gradient replaced by an isotropic
    standard normal vector, drawn from a generator seeded with ``seed``: the optimiser's chance
    baseline; the loss is still recorded). transport_state: when balancing by the group element
    g, move the optimiser's first-moment state (SGD's momentum buffer, Adam's exp_avg) like a
    gradient, by the inverse-transpose action of g (``transport_covector``); Adam's second
    moment (exp_avg_sq) holds squared coordinates, which no linear map of the coordinates
    transforms consistently, so it is kept as is.
    """
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {', '.join(GRADIENTS)}; got {gradient!r}")
    if rebalance not in REBALANCING:
        raise ValueError(f"rebalance must be one of {', '.join(REBALANCING)}; got {rebalance!r}")
    if steps < 1 or balance_every < 1 or measure_every < 0:
        raise ValueError(f"steps and balance_every must be >= 1 and measure_every >= 0; got {steps}, {balance_every}, {measure_every}")
    params = {n: p.detach().clone().requires_grad_() for n, p in problem.init(seed).items()}
    opt = make_optimiser(optimiser, list(params.values()), lr, weight_decay)
    attn = attention_part(params)
    spec = problem.spec
    start_c = bal.conserved_quantities({n: p.detach() for n, p in attn.items()}, spec)
    size = squared_norm(attn)
    history = History()
    noise = torch.Generator().manual_seed(30_000 + seed)
    for step in tqdm(range(steps), desc=f"{optimiser} {rebalance}", disable=not progress, leave=False):
        opt.zero_grad(set_to_none=True)
        if gradient == "loss":
            loss = problem.loss(params)
            loss.backward()
        else:
            with torch.no_grad():
                loss = problem.loss(params)
            for p in params.values():
                p.grad = torch.randn(p.shape, generator=noise, dtype=torch.float64).to(p)
        history.loss.append(float(loss.detach()))
        if not torch.isfinite(loss.detach()) or not all(torch.isfinite(p).all() for p in params.values()):
            history.diverged = step
            break
        before = {n: p.detach().clone() for n, p in attn.items()}
        opt.step()
        with torch.no_grad():
            update = {n: attn[n] - before[n] for n in attn}
            if measure_every and step % measure_every == 0:
                history.shares.append((step, invisible_shares(update, before, spec)))
            if rebalance == "project":
                tangent = SpanFamily(stack(sym.tangent_directions(before, spec), before))
                _subtract_flat(attn, tangent.project(flatten(update)))
            elif rebalance == "balance" and (step + 1) % balance_every == 0:
                point = {n: p.detach() for n, p in attn.items()}
                try:
                    element = bal.balancing_element(point, spec)
                except bal.SingularGramError:
                    history.diverged = step
                    break
                for name, value in sym.apply_group(point, spec, element).items():
                    attn[name].copy_(value)
                if transport_state:
                    _transport_state(opt, attn, spec, element)
            now = {n: p.detach() for n, p in attn.items()}
            history.drift.append(conservation_drift(start_c, bal.conserved_quantities(now, spec), size))
            history.key_bias.append(float(now["b_K"].norm()) if "b_K" in now else float("nan"))
    history.final = {n: p.detach().clone() for n, p in params.items()}
    return history


def _subtract_flat(params: dict[str, torch.Tensor], flat: torch.Tensor) -> None:
    start = 0
    for p in params.values():
        p.sub_(flat[start : start + p.numel()].reshape(p.shape))
        start += p.numel()


FIRST_MOMENTS = ("momentum_buffer", "exp_avg")  # SGD's and Adam's: sums of gradients, covectors


def transport_covector(covector: Params, spec: AttentionSpec, element: sym.GroupElement) -> dict[str, torch.Tensor]:
    """A gradient-like quantity moved with the parameters: if g maps theta to A theta, it maps a gradient to A^-T grad.

    For (M, N): W_Q -> W_Q M^-T, W_K -> W_K M, W_V -> W_V N^-T, W_O -> N^T W_O (biases like their
    weights), which is ``apply_group`` with (M^-T, N^-T). Then <grad', theta'> = <grad, theta> and the
    chain rule holds: the gradient of L(g^-1 .) at g theta is the transported gradient at theta.
    """
    inv_t = sym.GroupElement(torch.linalg.inv(element.query_key).transpose(-1, -2),
                             torch.linalg.inv(element.value_output).transpose(-1, -2))
    return sym.apply_group(covector, spec, inv_t)


def _transport_state(opt: torch.optim.Optimizer, attn: dict[str, torch.Tensor], spec: AttentionSpec,
                     element: sym.GroupElement) -> None:
    """Move the first-moment state of the attention layer's parameters with the group element (in place)."""
    for key in FIRST_MOMENTS:
        state = {n: opt.state[p][key] for n, p in attn.items() if key in opt.state.get(p, {})}
        if not state:
            continue
        if len(state) != len(attn):
            raise RuntimeError(f"optimiser state {key!r} covers only {sorted(state)} of the attention layer")
        for name, value in transport_covector(state, spec, element).items():
            state[name].copy_(value)

