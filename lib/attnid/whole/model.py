"""The whole model's count: what a transformer's function cannot see, beyond its attention layers.

A ``WholeLayout`` describes a stack the theory covers: token (and position, token-type) tables added
into a residual stream; ``layers`` blocks of attention and MLP, each read through a norm (``pre``) or
followed by one (``post``); a final norm; optionally a language-model head. ``count`` adds the
dimensions of the symmetry directions the book proves (chapter "The whole model", thm-whole-*),
component by component:

- ``embeddings``: the table gauges (E + 1 v^T, P - 1 v^T leaves every sum E[x] + P[p] unchanged), and,
  under a LayerNorm, each row's component along the all-ones vector 1 (the norm subtracts the mean);
- ``attention``: each layer's own orbit (``attnid.families.count``), with the query, key and value
  biases a LayerNorm's shift gives them (its output lies on an affine hyperplane);
- ``mlp``: per-neuron scalings (up/down of a gated MLP, positive scales through ReLU; a smooth plain MLP such
  as GELU has none);
- ``norms``: a pre-norm's gain (and LayerNorm shift) traded against the maps that read it, and the
  reader rows' moves along the norm's hyperplane where they have a bias; a post-norm's free shift;
- ``residual``: the stream's orthogonal change of basis (only when an untied head reads it: a
  visible final norm or a tied head pins it), its scale when eps = 0, and, under a LayerNorm, the
  all-ones component of every map that writes into the stream;
- ``head``: the final norm's gain (and shift) against an untied head; a tied head removes the token
  table's directions and keeps one gauge when the head has a bias.

All quantities are closed forms in the layout's integers: a 70B configuration counts in microseconds.
Genericity (chapter "The whole model", def-whole-generic): a parameter point off a closed set of measure
zero, inputs that reach every token, position and token type, more token rows than the width, and for ReLU
MLPs a point where every unit switches. That the closed form is the count there is measured, not proved
(rem-whole-status): every move is proved invisible, their independence and completeness are checked
against the float64 Jacobian.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

NORMS = ("rms", "layernorm")
PLACEMENTS = ("pre", "post")
MLP_KINDS = ("gated", "relu", "plain")  # plain: one smooth activation with no scaling symmetry (GELU, SiLU, tanh-GELU)
HEADS = ("none", "lm", "mlm")
COMPONENTS = ("embeddings", "attention", "mlp", "norms", "residual", "head")


@dataclass(frozen=True)
class Table:
    """An input table added into the stream: ``rows`` rows, of which inputs reach ``reachable``."""

    name: str
    rows: int
    reachable: int

    @property
    def unreachable(self) -> int:
        return self.rows - self.reachable


@dataclass(frozen=True)
class AttentionGroup:
    """``layers`` attention layers with one layout: parameters and unidentified count of one of them.

    ``unidentified`` is the layer's own orbit with the biases the stream gives it (``effective``);
    ``reader_rows`` the rows of W_Q, W_K, W_V; ``reader_bias_rows`` how many of them have a bias;
    ``writer_columns`` the columns of W_O; ``writer_bias`` whether b_O exists.
    """

    layers: int
    parameters: int
    unidentified: int
    reader_rows: int
    reader_bias_rows: int
    writer_columns: int
    writer_bias: bool


@dataclass(frozen=True)
class Mlp:
    """The MLP of every layer: ``kind`` (gated, relu or plain), hidden ``width``, biases in and out.

    A ReLU unit's positive scale is a symmetry everywhere; that it is the only one holds where every unit is
    active on some inputs and inactive on others (the switching region, open but not dense: a unit that is
    dead or always on over the inputs adds directions, def-whole-generic).
    """

    kind: str
    width: int
    bias_in: bool
    bias_out: bool

    @property
    def reader_rows(self) -> int:
        return 2 * self.width if self.kind == "gated" else self.width

    def total(self, d: int) -> int:
        """Parameters of one MLP."""
        return (self.reader_rows + self.width) * d + (self.reader_rows if self.bias_in else 0) + (d if self.bias_out else 0)

    @property
    def neuron_scalings(self) -> int:
        """Per-neuron scales: up/down of a gated MLP (any activation on the gate), ReLU's positive scales; a plain
        MLP has none."""
        return self.width if self.kind in ("gated", "relu") else 0


@dataclass(frozen=True)
class Head:
    """What reads the last hidden state: ``none`` (the base model), ``lm`` (a linear head, maybe tied to the
    token table) or ``mlm`` (BERT's transform: dense + activation + LayerNorm, then the tied decoder)."""

    kind: str = "none"
    tied: bool = False
    bias: bool = False
    unused: int = 0  # parameters the head's module holds but never reads (all invisible)


@dataclass(frozen=True)
class WholeLayout:
    """A transformer stack the whole-model theory covers (module docstring)."""

    d: int
    layers: int
    tables: tuple[Table, ...]
    norm: str
    placement: str
    eps: float
    attention: tuple[AttentionGroup, ...]
    mlp: Mlp
    embedding_norm: bool = False
    final_norm: bool = True
    norm_bias: bool = True  # LayerNorm with a shift b (RMSNorm never has one)
    parallel: bool = False  # attention and MLP read the same stream and write into it together (GPT-NeoX, GPT-J)
    head: Head = field(default_factory=Head)

    def __post_init__(self) -> None:
        if self.norm not in NORMS or self.placement not in PLACEMENTS or self.mlp.kind not in MLP_KINDS:
            raise ValueError(f"unknown norm/placement/mlp: {self.norm}, {self.placement}, {self.mlp.kind}")
        if self.head.kind not in HEADS:
            raise ValueError(f"unknown head {self.head.kind!r}; one of {HEADS}")
        if sum(g.layers for g in self.attention) != self.layers:
            raise ValueError("the attention groups must cover every layer once")

    @property
    def vocab(self) -> int:
        return self.tables[0].rows

    @property
    def layer_norm(self) -> bool:
        return self.norm == "layernorm"

    def norm_parameters(self) -> int:
        return self.d * (2 if self.layer_norm and self.norm_bias else 1)


@dataclass(frozen=True)
class WholeCount:
    """Parameters and unidentified parameters of a whole model, with the unidentified ones by component."""

    parameters: int
    unidentified: int
    breakdown: dict[str, int]
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.unidentified / self.parameters

    def record(self) -> dict[str, Any]:
        return {"parameters": self.parameters, "unidentified": self.unidentified, "ratio": self.ratio,
                "breakdown": dict(self.breakdown), "note": self.note}


def parameters(w: WholeLayout, with_head: bool) -> int:
    """Every parameter of the stack (and of its head when ``with_head``), each tied tensor once."""
    d, n = w.d, w.norm_parameters()
    total = sum(t.rows for t in w.tables) * d + sum(g.layers * g.parameters for g in w.attention)
    total += w.layers * (w.mlp.total(d) + 2 * n) + (n if w.embedding_norm else 0) + (n if w.final_norm else 0)
    if with_head and w.head.kind == "lm":
        total += (0 if w.head.tied else w.vocab * d) + (w.vocab if w.head.bias else 0)
    if with_head and w.head.kind == "mlm":
        total += d * d + d + n + (0 if w.head.tied else w.vocab * d) + (w.vocab if w.head.bias else 0)
    return total + (w.head.unused if with_head else 0)


def _embeddings(w: WholeLayout, tied: bool, head_bias: bool) -> int:
    """Table gauges, rows' mean components under a LayerNorm, and rows no input reaches (all their entries)."""
    d, k = w.d, len(w.tables)
    unreachable = sum(t.unreachable for t in w.tables) * d
    free = w.tables[1:] if tied else w.tables  # a tied token table is pinned by the head
    gauges = max(len(free) - 1, 0)  # independent gauges among the free tables
    if not w.layer_norm:
        return unreachable + gauges * d
    means = sum(t.reachable for t in free)
    # a gauge along 1 is already a mean component; the tied token table keeps the gauge along 1/g (head bias)
    kept = 1 if tied and head_bias and k >= 2 else 0
    return unreachable + means + gauges * (d - 1) + kept


def _pre_norm(w: WholeLayout, head: Head, c: Counter) -> None:
    d, ln = w.d, w.layer_norm
    per_norm = 2 * d if ln and w.norm_bias else d
    for g in w.attention:
        c["norms"] += g.layers * (per_norm + (g.reader_bias_rows if ln else 0))
        if ln:
            c["residual"] += g.layers * (g.writer_columns + int(g.writer_bias))
    c["norms"] += w.layers * (per_norm + ((w.mlp.reader_rows if w.mlp.bias_in else 0) if ln else 0))
    if ln:
        c["residual"] += w.layers * (w.mlp.width + int(w.mlp.bias_out))
    if w.parallel:  # b_O and the MLP's output bias land together: only their sum is seen (1 is counted already)
        c["residual"] += w.layers * (d - 1 if ln else d)
    if w.eps == 0:
        c["residual"] += 1  # the stream's scale
    if head.kind == "lm" and not head.tied:
        c["residual"] += (d - 1) * (d - 2) // 2 if ln else d * (d - 1) // 2  # O(d-1) fixing 1, or O(d)
        c["head"] += per_norm + (w.vocab if ln and head.bias else 0)


def _post_norm(w: WholeLayout, head: Head, c: Counter) -> None:
    d = w.d
    for g in w.attention:  # the norm before each attention: its shift (b_O absorbs it) and the reader rows' moves
        c["norms"] += g.layers * (d + g.reader_bias_rows)
        c["residual"] += g.layers * (g.writer_columns + int(g.writer_bias))
    c["norms"] += w.layers * (d + (w.mlp.reader_rows if w.mlp.bias_in else 0))  # the norm inside each layer, read by the MLP
    c["residual"] += w.layers * (w.mlp.width + int(w.mlp.bias_out))
    if w.eps == 0:
        c["residual"] += 1 + 2 * w.layers  # every LayerNorm's input scale
    if head.kind == "mlm":
        # the last norm is read by the transform's dense map with a bias (gain, shift, hyperplane rows: 3d); the
        # transform's norm is read by the decoder: tied, only its shift (the decoder's bias takes it back); untied,
        # its gain and shift against the decoder and the decoder's rows along the hyperplane (with its bias)
        c["head"] += 3 * d + (d if head.tied else 2 * d + (w.vocab if head.bias else 0))
        if w.eps == 0 and w.mlp.kind == "relu":  # the transform (same activation) scales through ReLU into its norm
            c["head"] += 1


def first_mlp_shortfall(w: WholeLayout) -> int:
    """A parallel block's first MLP reads only the V token rows: the directions it leaves unseen when V is small.

    The first layer's MLP sees its input only at the V normalised token embeddings, so its function is seen on V
    points, each giving d - 1 numbers past the mean. Checked numerically (tests/test_whole_model.py), not proved:
    the stack loses max(0, N - V (d - 1)) more directions, N = m (2d - 1) + d^2 - 1 (conj-whole-parallel).
    """
    if not w.parallel:
        return 0
    d, m = w.d, w.mlp.width
    return max(0, m * (2 * d - 1) + d * d - 1 - w.tables[0].reachable * (d - 1))


def count(w: WholeLayout, with_head: bool) -> WholeCount:
    """Parameters and unidentified parameters of the stack (``with_head``: of the model with its head)."""
    head = w.head if with_head else Head()
    c: Counter = Counter({k: 0 for k in COMPONENTS})
    tied = head.kind in ("lm", "mlm") and head.tied
    c["embeddings"] += _embeddings(w, tied, head.bias)
    c["attention"] += sum(g.layers * g.unidentified for g in w.attention)
    c["mlp"] += w.layers * w.mlp.neuron_scalings
    (_pre_norm if w.placement == "pre" else _post_norm)(w, head, c)
    c["head"] += head.unused
    shortfall = first_mlp_shortfall(w)
    if shortfall and tied:
        raise ValueError(f"a parallel first MLP on a short vocabulary ({w.vocab:,} tokens) under a tied head: the tied "
                         "head sees the token table again, and the shortfall is not known there")
    c["mlp"] += shortfall
    note = (f"includes {shortfall:,} directions of the first MLP, which reads only the {w.vocab:,} token embeddings: "
            "a count checked numerically, not proved (conj-whole-parallel)") if shortfall else ""
    breakdown = {k: int(c[k]) for k in COMPONENTS}
    return WholeCount(parameters(w, with_head), sum(breakdown.values()), breakdown, note)
