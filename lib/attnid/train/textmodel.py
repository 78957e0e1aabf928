"""A small causal byte-level transformer on real text, built around attnid's attention layer.

The corpus is the source of a pinned pure-Python package (``sympy`` by default): its ``.py``
files, code and docstrings as people wrote them, concatenated in sorted path order. It is on
every machine that installed the pinned requirements and is byte-for-byte the same there;
``load_corpus`` returns it with its SHA-256 and the package version, for the provenance.

The model, with every attention layer ``attnid.layer.forward`` in attnid's parameter layout
(so the orbit tangents, conserved quantities and balancing of ``attnid.symmetry`` apply):

    h_0 = E[x] (+ P[positions] when the attention has no RoPE)
    h_l = h_{l-1} + attn_l(norm(h_{l-1}))           attn_l = attnid.layer.forward
    h_l = h_l + W_out gelu(norm(h_l) W_in + b_in) + b_out
    logits = norm(h_L) U                            (norm: layer norm without gain or shift)

Every norm subtracts the mean, so the model cannot see more than each layer's orbit:
``attnid.train.textsym`` states and counts those directions (the mean directions on both sides of every
attention layer, the moves outside attention); ``invariant_subspaces`` hands the mean directions to
``attnid.train.modelsym`` and ``dead_parts`` names the parameters the loss cannot see.

``train_text`` trains it with ``attnid.train.training.make_optimiser`` on random windows of the
training split and measures, per attention layer, the invisible shares of its updates against
the model's invariant directions (``attnid.train.modelsym.model_shares``: the orbit and its parts,
and the mean directions), the drift of the conserved quantities, and the parameters the loss
cannot see (``dead_parts``: the dead key bias and the mean directions); it can move every
attention layer to the balanced point of its orbit every few steps. ``run_text`` runs one
such training from a picklable ``TextRun``, for ``attnid.train.sweep``. The paired statistics the
experiment reports come from ``attnid.train.stats``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnid.train import modelsym, wholeshare
from attnid import balancing as bal
from attnid.layer import forward as attention_forward
from attnid.layer import init_params as attention_init
from attnid.runtime import check_seed
from attnid.spec import AttentionSpec, Params
from attnid.train.training import DTYPES, GRADIENTS, conservation_drift, make_optimiser, squared_norm

VOCAB = 256  # bytes
REBALANCING = ("none", "balance")


# ------------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The bytes of a package's ``.py`` files in sorted path order, and where they came from."""

    package: str
    version: str
    files: int
    sha256: str
    data: torch.Tensor  # uint8, shape (n_bytes,)


def package_sources(package: str) -> list[Path]:
    """The ``.py`` files of an installed package, sorted by their path inside the package (POSIX form)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"no installed package {package!r} with a source folder (try 'sympy')")
    root = Path(next(iter(spec.submodule_search_locations)))
    files = [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(package: str = "sympy") -> Corpus:
    """The concatenated source bytes of ``package`` with their SHA-256, file count and package version."""
    files = package_sources(package)
    raw = b"".join(p.read_bytes() for p in files)
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return Corpus(package, importlib.metadata.version(package), len(files), hashlib.sha256(raw).hexdigest(), data)


def split_corpus(data: torch.Tensor, block: int = 65536, every: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the corpus cut into blocks of ``block`` bytes; block i is validation iff i % every == every - 1.

    Each split is its blocks concatenated in order, so a window can cross a seam between two
    blocks of the same split (one seam per ``block`` bytes).
    """
    if block < 2 or every < 2:
        raise ValueError(f"block must be >= 2 and every >= 2, got block={block}, every={every}")
    n_blocks = math.ceil(data.numel() / block)
    is_val = torch.arange(n_blocks) % every == every - 1
    pieces = list(torch.split(data, block))
    train = torch.cat([p for p, v in zip(pieces, is_val.tolist(), strict=True) if not v])
    val = torch.cat([p for p, v in zip(pieces, is_val.tolist(), strict=True) if v])
    return train, val


def random_batch(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch, seq_len) int64: windows at uniform random offsets, targets shifted by one byte."""
    if data.numel() < seq_len + 1:
        raise ValueError(f"the data ({data.numel()} bytes) are shorter than one window of {seq_len + 1}")
    starts = torch.randint(0, data.numel() - seq_len, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    windows = data[idx].long()
    return windows[:, :-1], windows[:, 1:]


def fixed_batches(data: torch.Tensor, n_windows: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_windows`` windows at evenly spaced offsets: the same evaluation set for every seed and run."""
    if n_windows < 1:
        raise ValueError(f"n_windows must be >= 1, got {n_windows}")
    if data.numel() < seq_len + 1:
        raise ValueError(f"the data ({data.numel()} bytes) are shorter than one window of {seq_len + 1}")
    starts = torch.linspace(0, data.numel() - seq_len - 1, n_windows).long()
    windows = data[starts[:, None] + torch.arange(seq_len + 1)].long()
    return windows[:, :-1], windows[:, 1:]


# ------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextModelSpec:
    """Layers, the attention layout every layer uses (causal), MLP width, and the longest sequence."""

    layers: int
    attention: AttentionSpec
    mlp_width: int
    seq_len: int

    def __post_init__(self) -> None:
        if self.layers < 1 or self.mlp_width < 1 or self.seq_len < 2:
            raise ValueError(f"need layers >= 1, mlp_width >= 1, seq_len >= 2; got {self.layers}, {self.mlp_width}, {self.seq_len}")
        if not self.attention.causal:
            raise ValueError("a language model needs causal attention: build the AttentionSpec with causal=True")

    @classmethod
    def create(cls, *, layers: int = 2, d_model: int = 64, heads: int = 4, kv_heads: int | None = None,
               rope_fraction: float = 0.5, bias: str = "qkvo", mlp_ratio: int = 4, seq_len: int = 64) -> "TextModelSpec":
        """A model with d_model / heads wide heads; kv_heads < heads gives GQA, rope_fraction > 0 RoPE."""
        attn = AttentionSpec.create(d_model, heads, kv_heads=kv_heads, rope_fraction=rope_fraction, bias=bias, causal=True)
        return cls(layers, attn, mlp_ratio * d_model, seq_len)

    @property
    def d_model(self) -> int:
        return self.attention.d_model

    @property
    def learned_positions(self) -> bool:
        """Without RoPE the model needs a learned position table to know where a byte is."""
        return self.attention.rope_dims == 0


def attention_prefix(layer: int) -> str:
    return f"layer{layer}.attn."


def layer_attention(params: Params, layer: int) -> dict[str, torch.Tensor]:
    """The attention parameters of ``layer`` in attnid's layout (names without the prefix)."""
    prefix = attention_prefix(layer)
    return {n.removeprefix(prefix): p for n, p in params.items() if n.startswith(prefix)}


def init_model(spec: TextModelSpec, generator: torch.Generator, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A random point, drawn in float64 on the CPU then cast and moved (device-independent draws).

    Attention layers: ``attnid.layer.init_params`` (biases included, so b_K starts non-zero).
    Embedding N(0, 1); MLP and unembedding Gaussian with variance 1 / fan-in, MLP biases zero.
    """
    d, w = spec.d_model, spec.mlp_width

    def draw(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64) * scale

    params: dict[str, torch.Tensor] = {"embed": draw(VOCAB, d, scale=1.0)}
    if spec.learned_positions:
        params["pos"] = draw(spec.seq_len, d, scale=1.0)
    for layer in range(spec.layers):
        for name, p in attention_init(spec.attention, generator).items():
            params[attention_prefix(layer) + name] = p
        params[f"layer{layer}.mlp.W_in"] = draw(d, w, scale=d**-0.5)
        params[f"layer{layer}.mlp.b_in"] = torch.zeros(w, dtype=torch.float64)
        params[f"layer{layer}.mlp.W_out"] = draw(w, d, scale=w**-0.5)
        params[f"layer{layer}.mlp.b_out"] = torch.zeros(d, dtype=torch.float64)
    params["unembed"] = draw(d, VOCAB, scale=d**-0.5)
    return {n: p.to(device=device, dtype=dtype) for n, p in params.items()}


def _norm(h: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(h, h.shape[-1:])


def attention_block(params: Params, h: torch.Tensor, spec: TextModelSpec, layer: int) -> torch.Tensor:
    """The attention sub-layer's contribution to the residual stream: attnid.layer.forward(norm(h))."""
    return attention_forward(layer_attention(params, layer), _norm(h), spec.attention)


def logits(params: Params, tokens: torch.Tensor, spec: TextModelSpec) -> torch.Tensor:
    """Next-byte logits (batch, n, 256) for byte ids (batch, n), n <= seq_len."""
    n = tokens.shape[-1]
    if n > spec.seq_len:
        raise ValueError(f"sequence length {n} exceeds the model's seq_len {spec.seq_len}")
    h = params["embed"][tokens]
    if spec.learned_positions:
        h = h + params["pos"][:n]
    for layer in range(spec.layers):
        h = h + attention_block(params, h, spec, layer)
        mlp = f"layer{layer}.mlp."
        hidden = F.gelu(_norm(h) @ params[mlp + "W_in"] + params[mlp + "b_in"])
        h = h + hidden @ params[mlp + "W_out"] + params[mlp + "b_out"]
    return _norm(h) @ params["unembed"]


def loss(params: Params, inputs: torch.Tensor, targets: torch.Tensor, spec: TextModelSpec) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats."""
    out = logits(params, inputs, spec)
    return F.cross_entropy(out.reshape(-1, VOCAB).float(), targets.reshape(-1))


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------


DEAD_PARTS = ("key_bias", "input_mean", "output_mean")


def invariant_subspaces(spec: TextModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_null, output_null) of every attention layer for ``attnid.train.modelsym``: both span(1), exactly."""
    one = modelsym.mean_direction(spec.d_model)
    return one, one


def dead_key_bias(attn: Params, spec: AttentionSpec) -> torch.Tensor:
    """The coordinates of b_K that softmax cannot see: the unrotated ones, b_K[:, r:] (empty without b_K or with a QK-norm).

    """
    if "b_K" not in attn or not spec.shift_invariant or spec.has_qk_norm:  # a QK-norm sees every coordinate
        return torch.zeros(0)
    return attn["b_K"][:, spec.rope_dims:].reshape(-1)


def dead_parts(attn: Params, spec: AttentionSpec) -> dict[str, torch.Tensor]:
    """The coordinates of one attention layer the loss cannot see, by part (each a vector; empty parts left out).

    'key_bias': the dead key bias, a set of coordinates: their exact gradient is zero, so Adam moves
    them only by its coordinate-wise scaling of round-off (a step of at most about lr |g| / (|g| + eps),
    with |g| the round-off gradient). 'input_mean': 1^T W / sqrt(d) for W = W_Q, W_K, W_V,
    concatenated; 'output_mean': W_O 1 / sqrt(d) and b_O . 1 / sqrt(d). These are not coordinates but
    sums of them, so Adam, which rescales every coordinate of a gradient orthogonal to them by its own
    factor, moves them even in exact arithmetic.
    """
    one = modelsym.mean_direction(spec.d_model).to(attn["W_Q"]).reshape(-1)
    parts = {"key_bias": dead_key_bias(attn, spec),
             "input_mean": torch.cat([torch.einsum("sdc,d->sc", attn[w], one).reshape(-1) for w in modelsym.INPUT_WEIGHTS]),
             "output_mean": torch.cat([(attn["W_O"] @ one).reshape(-1)] + ([(attn["b_O"] @ one).reshape(1)] if "b_O" in attn else []))}
    return {k: v for k, v in parts.items() if v.numel()}



@dataclass
class TextHistory:
    """What ``train_text`` records. Per-layer rows carry the layer index."""

    eval_steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # mean training loss since the previous evaluation
    val_loss: list[float] = field(default_factory=list)
    shares: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)  # (step, layer, shares)
    drift: list[tuple[int, ...]] = field(default_factory=list)
    # (step, layer, ||dC_QK||, ||dC_VO||, ||(dGram_Q, dGram_K)||, ||(dGram_V, dGram_O)||, then the same four
    # with d X = X(t) - s X(0), s = (1 - lr wd)^(2t) the factor AdamW's decay alone gives), over the squared norm at step 0
    dead: list[tuple[int, int, str, float, float, float]] = field(default_factory=list)
    whole: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (step, attnid.train.wholeshare.whole_share)
    # (step, layer, part of dead_parts, ||b(t) - b(0)|| / ||b(0)||, ||b(t) - decay^t b(0)|| / ||b(0)||, rms per-step move / lr)


def gram_drift(start: tuple[torch.Tensor, ...], now: tuple[torch.Tensor, ...], spec: AttentionSpec, size: float,
               scale: float = 1.0) -> tuple[float, float]:
    """The conserved quantities' scale of comparison: sqrt(||dGram_Q||^2 + ||dGram_K||^2) and the same for V, O, over ``size``.

    C_QK = Gram_Q - Gram_K (projected on the RoPE commutant) and C_VO = Gram_V - Gram_O. If the
    two Grams of a pair changed independently of each other, ||dC|| would be about this number;
    if C is conserved, ||dC|| = 0 however far the Grams move. ``start``, ``now``: the four Grams;
    the change is measured from ``scale`` times the start (dX = X(t) - scale X(0)).
    """
    dq, dk, dv, do = (b - scale * a for a, b in zip(start, now, strict=True))
    dq, dk = bal.project_commutant(dq, spec), bal.project_commutant(dk, spec)
    return (float(torch.sqrt(dq.norm() ** 2 + dk.norm() ** 2) / size), float(torch.sqrt(dv.norm() ** 2 + do.norm() ** 2) / size))


@torch.no_grad()
def evaluate(params: Params, batches: tuple[torch.Tensor, torch.Tensor], spec: TextModelSpec, chunk: int = 32) -> float:
    """Mean next-byte loss over a fixed evaluation set, in chunks of ``chunk`` windows."""
    inputs, targets = batches
    total = 0.0
    for start in range(0, inputs.shape[0], chunk):
        x, y = inputs[start : start + chunk], targets[start : start + chunk]
        total += float(loss(params, x, y, spec)) * x.shape[0]
    return total / inputs.shape[0]


def train_text(
    spec: TextModelSpec, train_data: torch.Tensor, val_batches: tuple[torch.Tensor, torch.Tensor], *,
    seed: int, steps: int, batch: int, optimiser: str = "adamw", lr: float = 3e-3, weight_decay: float = 0.0,
    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", rebalance: str = "none",
    balance_every: int = 50, measure_every: int = 0, shares_every: int = 0, eval_every: int = 50, progress: bool = False,
    gradient: str = "loss", whole_every: int = 0,
) -> TextHistory:
    """Train from ``init_model(seed)`` on random windows drawn with the same seed; see the module docstring.

    rebalance 'balance': every ``balance_every`` steps, each attention layer moves to the
    balanced point of its orbit (``attnid.balancing.balance``, computed in float64): the same
    function; the optimiser state stays as it is. measure_every: every so many steps (0: never)
    record, per attention layer, the drift of the conserved quantities since step 0 next to the
    drift of the Gram matrices they are differences of (``gram_drift``), both also measured from
    the start shrunk by AdamW's decay, and every part of ``dead_parts``;
    shares_every: every so many steps (0: never) the invisible shares of that step's update
    (``modelsym.model_shares`` with ``invariant_subspaces``: the orbit's and the model's).
    Validation loss every ``eval_every`` steps and after the last step.
    gradient: 'loss' (the training loss's gradient) or 'random' (every parameter's gradient
    replaced by an isotropic standard normal vector from a generator seeded with ``seed``: the
    same optimiser fed noise, the chance baseline of the shares; the loss is still recorded).
    whole_every: every so many steps (0: never) the share of that step's update of every parameter in the
    span of everything the whole model cannot see (``attnid.train.wholeshare``).
    """
    seed = check_seed(seed)
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {', '.join(GRADIENTS)}; got {gradient!r}")
    if rebalance not in REBALANCING:
        raise ValueError(f"rebalance must be one of {', '.join(REBALANCING)}; got {rebalance!r}")
    if min(steps, batch, balance_every, eval_every) < 1 or min(measure_every, shares_every, whole_every) < 0:
        raise ValueError(f"steps, batch, balance_every, eval_every must be >= 1, measure_every, shares_every and "
                         f"whole_every >= 0; got {steps}, {batch}, {balance_every}, {eval_every}, {measure_every}, "
                         f"{shares_every}, {whole_every}")
    gen = torch.Generator().manual_seed(seed)
    params = {n: p.requires_grad_() for n, p in init_model(spec, gen, dtype, device).items()}
    opt = make_optimiser(optimiser, list(params.values()), lr, weight_decay)
    decay = 1.0 - lr * weight_decay if optimiser == "adamw" else 1.0
    attn = [layer_attention(params, layer) for layer in range(spec.layers)]
    as64 = [lambda a=a: {n: p.detach().to("cpu", torch.float64, copy=True) for n, p in a.items()} for a in attn]
    start_c = [bal.conserved_quantities(f(), spec.attention) for f in as64]
    start_g = [bal.grams(f(), spec.attention) for f in as64]
    size = [squared_norm(f()) for f in as64]

    dead0 = [dead_parts(f(), spec.attention) for f in as64]
    input_null, output_null = invariant_subspaces(spec)
    val_device = tuple(t.to(device) for t in val_batches)
    history = TextHistory()
    data_gen = torch.Generator().manual_seed(1_000_003 + seed)
    noise = torch.Generator().manual_seed(2_000_003 + seed)  # the random gradients (gradient='random')
    running: list[float] = []
    for step in tqdm(range(steps), desc=f"seed {seed} {rebalance}", disable=not progress, leave=False):
        x, y = (t.to(device) for t in random_batch(train_data, batch, spec.seq_len, data_gen))
        opt.zero_grad(set_to_none=True)
        if gradient == "loss":
            value = loss(params, x, y, spec)
            value.backward()
        else:
            with torch.no_grad():
                value = loss(params, x, y, spec)
            for p in params.values():
                p.grad = torch.randn(p.shape, generator=noise, dtype=torch.float64).to(p)
        running.append(float(value.detach()))
        measure = bool(measure_every) and step % measure_every == 0
        shares = bool(shares_every) and step % shares_every == 0
        before = [f() for f in as64] if measure or shares else None
        whole = bool(whole_every) and step % whole_every == 0
        if whole:
            whole_before = {n: p.detach().to("cpu", torch.float64, copy=True) for n, p in params.items()}
            span = wholeshare.whole_span(whole_before, spec.attention)
        opt.step()
        if whole:
            history.whole.append((step, wholeshare.whole_share(
                {n: p.detach().to("cpu", torch.float64) - whole_before[n] for n, p in params.items()}, span)))
        with torch.no_grad():
            for layer, f in enumerate(as64 if measure or shares else []):
                now = f()
                if shares:
                    update = {n: now[n] - before[layer][n] for n in now}
                    history.shares.append((step, layer, modelsym.model_shares(update, before[layer], spec.attention,
                                                                              input_null, output_null)))
                if measure:
                    c_now, g_now = bal.conserved_quantities(now, spec.attention), bal.grams(now, spec.attention)
                    shrink = decay ** (2 * (step + 1))  # AdamW's decay alone multiplies every Gram, so C, by this
                    history.drift.append((
                        step, layer, *conservation_drift(start_c[layer], c_now, size[layer]),
                        *gram_drift(start_g[layer], g_now, spec.attention, size[layer]),
                        *conservation_drift(tuple(shrink * c for c in start_c[layer]), c_now, size[layer]),
                        *gram_drift(start_g[layer], g_now, spec.attention, size[layer], scale=shrink)))
                    dead_now, dead_before = dead_parts(now, spec.attention), dead_parts(before[layer], spec.attention)
                    for part, b0 in dead0[layer].items():
                        bt = dead_now[part]
                        moved = float((bt - b0).norm() / b0.norm())
                        beyond = float((bt - decay ** (step + 1) * b0).norm() / b0.norm())
                        rms_step = float((bt - decay * dead_before[part]).pow(2).mean().sqrt() / lr)
                        history.dead.append((step, layer, part, moved, beyond, rms_step))
            if rebalance == "balance" and (step + 1) % balance_every == 0:
                for a, f in zip(attn, as64, strict=True):
                    for name, value64 in bal.balance(f(), spec.attention).items():
                        a[name].copy_(value64.to(a[name]))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            history.eval_steps.append(step + 1)
            history.train_loss.append(sum(running) / len(running))
            history.val_loss.append(evaluate(params, val_device, spec))
            running = []
    return history


# ------------------------------------------------------------------------------------------------
# One run as a task of a sweep
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextRun:
    """Everything one ``train_text`` run needs, picklable: the model, the corpus by name, the run's settings.

    ``settings`` holds ``train_text``'s keyword arguments other than the model, the data, the
    seed and the dtype (steps, batch, optimiser, lr, ...), as (name, value) pairs.
    """

    spec: TextModelSpec
    seed: int
    dtype: str
    val_windows: int
    settings: tuple[tuple[str, object], ...]
    corpus: str = "sympy"
    label: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")


@lru_cache(maxsize=2)
def corpus_splits(package: str, seq_len: int, val_windows: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(training split, fixed validation batches) of ``load_corpus(package)``, loaded once per process."""
    train, val = split_corpus(load_corpus(package).data)
    return train, fixed_batches(val, val_windows, seq_len)


def run_text(run: TextRun) -> TextHistory:
    """``train_text`` for one ``TextRun`` (a module-level function, so a sweep's workers can import it)."""
    train, val = corpus_splits(run.corpus, run.spec.seq_len, run.val_windows)
    return train_text(run.spec, train, val, seed=run.seed, dtype=DTYPES[run.dtype], **dict(run.settings))

