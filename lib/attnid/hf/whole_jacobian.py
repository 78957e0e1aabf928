"""The whole-model count checked numerically: the float64 Jacobian of a transformers model built from a config.

``measure(data, head=...)`` builds the model ``architectures[0]`` names (``head=True``, the logits) or its
backbone (``head=False``, the last hidden state) from a small configuration, draws a random point where
every parameter is away from special values (matrices Gaussian over sqrt(fan-in), norm gains of random
sign and size in [0.5, 1.5], every other vector Gaussian), and stacks the Jacobian of the output with
respect to all parameters over input sequences until its rank is stable. The rank follows the book's rule
(``attnid.rank``: singular values above 1e-10 of the largest, six decades of gap, rows that do not cap it).

Three things the verification does that the model alone would not:

- **float64 throughout.** transformers' RMSNorm casts to float32; the model runs inside
  ``float64_kept()`` (``attnid.hf.modules``), and the attention through SDPA, whose softmax keeps float64.
- **padding rows.** ``nn.Embedding(padding_idx=...)`` zeroes that row's gradient although the function reads
  the row; the verification clears ``padding_idx`` so the Jacobian is the function's.
- **eps.** A norm's eps > 0 breaks the stream's scale symmetry only by eps / (the norm's input variance):
  BERT's 1e-12 would leave singular values of about 1e-12, below the zero tolerance. Scaling every norm's
  input by c turns eps into eps / c^2 with an invertible change of parameters (thm-whole-eps), so every eps > 0
  has the same generic rank; the verification runs with ``VERIFY_EPS`` in place of any eps > 0, and with 0 for 0.
  A norm whose input no such scaling reaches keeps the configuration's own eps (``OWN_EPS``: BERT's masked-LM
  transform, which reads a GELU); no move of the theory depends on its eps. Through a ReLU the scaling reaches
  it, and it runs at ``VERIFY_EPS`` like the rest.

- **ReLU units switch.** A ReLU unit dead or always on over the inputs adds directions (def-whole-generic), and a
  Gaussian draw leaves many such units in a small model. The count holds where every unit switches, so the
  verification draws its point there: layer by layer, each unit's input bias is moved by minus the 30%
  quantile of its pre-activation over a fixed batch, so it is active on about 70% of the inputs (a ReLU
  feeding a norm directly, as in BERT's transform, then rarely hands the norm an all-zero vector).

Inputs reach every token (the first sequences are a shuffled vocabulary), every position (sequences of the
full learned length, up to ``MAX_LENGTH``) and every token type (drawn at random).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnid.hf.modules import float64_kept
from attnid.jacobian import RankAccumulator
from attnid.rank import RankDecision

VERIFY_EPS = 1e-3  # any eps > 0 has the same generic rank (thm-whole-eps); this one keeps the broken directions clear
MAX_LENGTH = 8
OWN_EPS = ("predictions.transform.LayerNorm",)  # norms that keep the configuration's eps (see the docstring)
EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
MAX_PARAMETERS = 20_000
MAX_ROWS_PER_PARAMETER = 8  # the rank must settle before the rows reach 8 P, or the check says it did not


@dataclass(frozen=True)
class Measured:
    """The numeric nullity of a model's Jacobian at one random point."""

    parameters: int
    nullity: int
    decision: RankDecision
    rows: int


def _verification_config(data: dict[str, Any]) -> Any:
    """transformers' configuration for ``data`` with every norm eps > 0 (given or defaulted) set to ``VERIFY_EPS``."""
    from attnid.hf.whole import transformers_config

    cfg = transformers_config(data)
    for name in EPS_FIELDS:
        value = getattr(cfg, name, None)
        if isinstance(value, (int, float)) and value > 0:
            setattr(cfg, name, VERIFY_EPS)
    cfg._attn_implementation = "eager" if data["model_type"] == "gpt2" else "sdpa"
    return cfg


def _own_config(data: dict[str, Any]) -> Any:
    from attnid.hf.whole import transformers_config

    cfg = transformers_config(data)
    cfg._attn_implementation = "eager" if data["model_type"] == "gpt2" else "sdpa"
    return cfg


def _load(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a checkpoint's tensors (float64); every parameter must come from it (a tied one through its twin)."""
    missing = [name for name, _ in model.named_parameters() if name not in state]
    if missing:
        raise ValueError(f"the checkpoint has no tensor {missing[0]} (and {len(missing) - 1} more missing)"
                         if len(missing) > 1 else f"the checkpoint has no tensor {missing[0]}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if tuple(state[name].shape) != tuple(p.shape):
                raise ValueError(f"tensor {name}: shape {tuple(state[name].shape)}, the configuration says {tuple(p.shape)}")
            p.copy_(state[name].to(torch.float64))
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None


def _own_eps(data: dict[str, Any]) -> float:
    from attnid.hf.whole import transformers_config

    cfg = transformers_config(data)
    return next((float(getattr(cfg, n)) for n in EPS_FIELDS if isinstance(getattr(cfg, n, None), (int, float))), 0.0)


def _is_gain(name: str) -> bool:
    lowered = name.lower()
    return name.endswith("weight") and any(w in lowered for w in ("norm", "ln_", "ln.", "layernorm"))


def _randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(p.shape[-1]))
            elif _is_gain(name):
                sign = torch.where(torch.rand(p.shape, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
                p.copy_(sign * (0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64)))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None


# The maps whose outputs a ReLU reads, by model type (a unit's input bias is their bias); BERT's MLM transform too.
RELU_INPUTS = {"opt": ("fc1",), "gpt2": ("mlp.c_fc",), "gpt_neox": ("mlp.dense_h_to_4h",),
               "bert": ("intermediate.dense", "predictions.transform.dense")}
SWITCH_BATCH = 32
SWITCH_QUANTILE = 0.3


def _switching(model: torch.nn.Module, cfg: Any, seed: int) -> None:
    """Move every ReLU unit's input bias so the unit is active on about 70% of a fixed batch (layer by layer)."""
    maps = [m for name, m in model.named_modules() if name.endswith(RELU_INPUTS[cfg.model_type])]
    sequences = _sequences(cfg, _length(cfg), torch.Generator().manual_seed(seed + 2))
    batch = [next(sequences) for _ in range(SWITCH_BATCH)]
    for linear in maps:
        seen: list[torch.Tensor] = []
        hook = linear.register_forward_hook(lambda _m, _i, out: seen.append(out.detach().reshape(-1, out.shape[-1])))
        with float64_kept(), torch.no_grad():
            for ids, tt in batch:
                model(input_ids=ids, **({} if tt is None else {"token_type_ids": tt}))
        hook.remove()
        with torch.no_grad():
            linear.bias -= torch.quantile(torch.cat(seen), SWITCH_QUANTILE, dim=0)


def build(data: dict[str, Any], seed: int = 0, switching: bool = True,
          state: dict[str, torch.Tensor] | None = None) -> tuple[torch.nn.Module, Any]:
    """(the model ``architectures[0]`` names, in float64 at a random point; its configuration).

    ``switching``: ReLU units are moved into the switching region (module docstring); False keeps the Gaussian draw.
    ``state``: a trained checkpoint's tensors instead of a random point; the norms then keep their own eps.
    """
    import transformers

    cfg = _verification_config(data) if state is None else _own_config(data)
    name = (data.get("architectures") or [None])[0]
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"architectures[0] {name!r} is not a transformers class")
    model = cls(cfg).to(torch.float64).eval()
    if state is not None:
        _load(model, state)
        return model, cfg
    own = _own_eps(data)
    activation = getattr(cfg, "activation_function", None) or getattr(cfg, "hidden_act", None)
    for module_name, module in model.named_modules():
        if module_name.endswith(OWN_EPS) and activation != "relu":  # through a ReLU the scaling reaches it
            module.eps = own
    _randomise(model, seed)
    if activation == "relu" and switching:
        _switching(model, cfg, seed)
    return model, cfg


def _sequences(cfg: Any, length: int, gen: torch.Generator) -> Any:
    """Input sequences: first a shuffled vocabulary in rows of ``length``, then random ones, forever."""
    vocab = cfg.vocab_size
    order = torch.randperm(vocab, generator=gen)
    cover = math.ceil(vocab / length)
    types = getattr(cfg, "type_vocab_size", None)
    i = 0
    while True:
        if i < cover:
            ids = order[torch.arange(i * length, (i + 1) * length) % vocab]
        else:
            ids = torch.randint(0, vocab, (length,), generator=gen)
        tt = torch.randint(0, types, (1, length), generator=gen) if types else None
        yield ids.view(1, length), tt
        i += 1


def _length(cfg: Any) -> int:
    learned = getattr(cfg, "n_positions", None) or (getattr(cfg, "max_position_embeddings", None)
                                                    if cfg.model_type in ("bert", "opt") else None)
    return min(MAX_LENGTH, learned) if learned else MAX_LENGTH


def next_decision(total: int, rows: int, rank: int, previous: tuple[int, int] | None) -> int:
    """The row count at which ``measure`` decides the rank again, after a decision of ``rank`` at ``rows``.

    P / 4 rows later; but while the rank still grows (``previous``: the last decision's rows and rank), as many
    rows later as that growth rate would take to reach full rank P (at most twice the rows so far), so a slowly
    filling Jacobian (a head's logits: many rows, few new directions each) is not decided at every quarter of P.
    Never past the point where the confirming decision, P / 4 later, would exceed the row cap. This sets only when
    the rule is applied; the stopping rule itself (the same clear rank twice, P / 4 rows apart) is unchanged.
    """
    step = max(total // 4, 1)
    if previous is None or rank <= previous[1]:
        return rows + step
    rate = (rank - previous[1]) / (rows - previous[0])
    ahead = math.ceil((total - rank) / rate)
    return rows + max(step, min(ahead, rows, MAX_ROWS_PER_PARAMETER * total - step - rows))


def measure(data: dict[str, Any], *, head: bool, seed: int = 0, switching: bool = True,
            state: dict[str, torch.Tensor] | None = None) -> Measured:
    """The nullity of the output's float64 Jacobian (logits with ``head``, else the backbone's last hidden state).

    ``state``: at a trained checkpoint's tensors (and its norms' own eps) instead of a random point.
    """
    model, cfg = build(data, seed, switching, state)
    module = model if head else model.base_model
    params = dict(module.named_parameters())
    names, shapes = list(params), [p.shape for p in params.values()]
    sizes = [p.numel() for p in params.values()]
    total = sum(sizes)
    if total > MAX_PARAMETERS:
        raise ValueError(f"{total:,} parameters: the dense Jacobian is for small configurations "
                         f"(at most {MAX_PARAMETERS:,})")
    flat = torch.cat([p.detach().reshape(-1) for p in params.values()])

    def output(x: torch.Tensor, ids: torch.Tensor, tt: torch.Tensor | None) -> torch.Tensor:
        named = dict(zip(names, (t.view(s) for t, s in zip(torch.split(x, sizes), shapes))))
        kwargs = {"input_ids": ids} if tt is None else {"input_ids": ids, "token_type_ids": tt}
        out = torch.func.functional_call(module, named, (), kwargs)
        return (out.logits if head else out.last_hidden_state).reshape(-1)

    gen = torch.Generator().manual_seed(seed + 1)
    stacked = RankAccumulator(total)  # the rows folded into a running QR: the same singular values, P x P
    target, last, last_rows = total, None, 0
    # SDPA's math backend (plain matmuls and softmax in float64), which torch.func batches: the fused CPU
    # kernel has no batching rule for its backward, and vmap ran it one Jacobian row at a time (measured warm,
    # one thread: 1.0 to 1.6 times slower)
    with float64_kept(), sdpa_kernel(SDPBackend.MATH):
        for ids, tt in _sequences(cfg, _length(cfg), gen):
            stacked.add(torch.func.jacrev(output)(flat, ids, tt).detach())
            rows = stacked.n_rows
            if rows < target:
                continue
            if rows > MAX_ROWS_PER_PARAMETER * total:
                raise ValueError(f"the rank did not settle by {rows:,} Jacobian rows for {total:,} parameters "
                                 f"(last: rank {last.rank if last else '?'}, clear {last.clear if last else '?'})")
            decision = stacked.decide()
            if last is not None and decision.rank == last.rank and decision.clear:
                return Measured(total, decision.nullity, decision, rows)
            target = next_decision(total, rows, decision.rank, None if last is None else (last_rows, last.rank))
            last, last_rows = decision, rows
    raise AssertionError("unreachable")
