"""The attention layouts each chapter verifies numerically: one definition per grid.

The chapters build their grids here, and the certificate appendix rebuilds every grid from the
same functions with each chapter's own parameter defaults (``CHAPTER_GRIDS``), so a grid can
only change in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnid.spec import AttentionSpec, standard_layouts

# The head layouts chapters 5 and 6 run each variant on: one head, two heads, four query heads on two key/value heads.
HEAD_LAYOUTS: tuple[dict[str, int], ...] = (dict(heads=1), dict(heads=2), dict(heads=4, kv_heads=2))


def one_head(grid_d: Sequence[int]) -> list[AttentionSpec]:
    """Chapter 2: one head at each width, narrow, square, wide and 1-wide heads, with and without a causal mask."""
    specs = []
    for d in grid_d:
        for dk, dv in sorted({(d, d), (max(1, d // 2), d), (d, max(1, d // 2)), (d + 2, d), (1, 1)}):
            for causal in (False, True):
                specs.append(AttentionSpec.create(d, 1, head_dim=dk, v_head_dim=dv, causal=causal))
    return specs


def one_head_width_sweep(d_model: int, max_width: int) -> list[AttentionSpec]:
    """Chapter 2's figure: one head, query/key width 1 to ``max_width``, value width d_model."""
    return [AttentionSpec.create(d_model, 1, head_dim=k, v_head_dim=d_model) for k in range(1, max_width + 1)]


def many_heads(widths: Sequence[int]) -> list[AttentionSpec]:
    """Chapter 3: every head count dividing each width, standard head widths."""
    return [AttentionSpec.create(w, h) for w in widths for h in range(1, w + 1) if w % h == 0]


def never_identified(widths: Sequence[int]) -> list[AttentionSpec]:
    """Chapter 4: the standard layouts (MHA, GQA, MQA, with and without RoPE) of every width."""
    return [spec for w in widths for spec in standard_layouts(w)]


def biases(d_model: int) -> list[AttentionSpec]:
    """Chapter 5: bias combinations under each normalisation, then heads wider than the model with a sink."""
    specs = []
    for base in HEAD_LAYOUTS:
        for bias in ("none", "k", "v", "vo", "qkvo"):
            specs.append(AttentionSpec.create(d_model, bias=bias, **base))
        specs.append(AttentionSpec.create(d_model, bias="qkvo", causal=True, **base))
        specs.append(AttentionSpec.create(d_model, bias="qkvo", norm="sink", **base))
        specs.append(AttentionSpec.create(d_model, bias="qkvo", norm="sink", sink_learned=True, **base))
        specs.append(AttentionSpec.create(d_model, bias="qkvo", norm="sigmoid", **base))
        specs.append(AttentionSpec.create(d_model, bias="qkvo", rope_fraction=1.0, **base))
        half = 2 * ((d_model // base["heads"]) // 4)  # an even r below d_k, where the head is wide enough
        if half:
            specs.append(AttentionSpec.create(d_model, bias="qkvo", rope_dims=half, **base))
    return specs + wide_sink_pair()


def wide_sink_pair() -> list[AttentionSpec]:
    """Heads wider than the model (d_k > d) with b_Q and b_K: a fixed and a learned sink (chapter 5's exception)."""
    return [AttentionSpec.create(3, 2, head_dim=5, v_head_dim=2, bias="qk", norm="sink", sink_learned=learned)
            for learned in (False, True)]


def rope(d_model: int) -> list[AttentionSpec]:
    """Chapter 6: full and partial RoPE with and without biases, causal, and a sink and a sigmoid variant."""
    specs = []
    for base in HEAD_LAYOUTS:
        dk = d_model // base["heads"]
        for r in sorted({2, dk // 2 - (dk // 2) % 2, dk} - {0}):
            for bias in ("none", "qkvo"):
                specs.append(AttentionSpec.create(d_model, rope_dims=r, bias=bias, **base))
        specs.append(AttentionSpec.create(d_model, rope_fraction=1.0, causal=True, **base))
        specs.append(AttentionSpec.create(d_model, rope_dims=2, bias="qkvo", norm="sink", sink_learned=True, **base))
        specs.append(AttentionSpec.create(d_model, rope_fraction=1.0, bias="qkvo", norm="sigmoid", causal=True, **base))
    return specs


def rope_bases(d_model: int, bases: Sequence[float]) -> list[AttentionSpec]:
    """Chapter 6's context-length figure: one head with full RoPE for each base."""
    return [AttentionSpec.create(d_model, 1, rope_fraction=1.0, rope_base=b) for b in bases]


def gqa(d_model: int, heads: Sequence[int]) -> list[AttentionSpec]:
    """Chapter 7: the standard layouts of one width for the given query-head counts."""
    return standard_layouts(d_model, heads=list(heads))


def qk_norm(d_model: int, eps: float, variants: Sequence[str] = ("shared", "per-head", "full", "unweighted")
            ) -> list[AttentionSpec]:
    """Chapter 7b: every QK-norm variant with eps = 0 and eps > 0, on two head layouts, bare and with biases and RoPE.

    The second layout of each head layout has all four biases, full RoPE and a causal mask; the third a learned
    sink with q/k/v biases and partial RoPE where the head is wide enough for it (full RoPE otherwise).
    """
    specs = []
    for variant in variants:
        for e in (0.0, eps):
            for base in (dict(heads=2), dict(heads=4, kv_heads=2)):
                dk = d_model // base["heads"]
                rope = 0.5 if dk % 4 == 0 else 1.0
                for extra in (dict(), dict(bias="qkvo", rope_fraction=1.0, causal=True),
                              dict(bias="qkv", rope_fraction=rope, norm="sink", sink_learned=True)):
                    specs.append(AttentionSpec.create(d_model, qk_norm=variant, qk_norm_eps=e, **base, **extra))
    return specs


def windows(d_model: int, widths: Sequence[int] = (2, 3, 4)) -> list[AttentionSpec]:
    """Chapter 7b: causal sliding windows of each width the counts cover, across biases, RoPE, sinks and QK-norm."""
    specs = []
    for w in widths:
        for extra in (dict(bias="qkvo"), dict(bias="qkvo", norm="sink", sink_learned=True),
                      dict(bias="qkv", rope_fraction=1.0), dict(heads=4, kv_heads=2, rope_fraction=1.0, norm="sigmoid"),
                      dict(bias="qkvo", rope_fraction=1.0, qk_norm="shared")):
            if w < 3 and "rope_fraction" in extra:
                continue  # a window of 2 keys with RoPE is outside the counts (the chapter measures why)
            specs.append(AttentionSpec.create(d_model, **{"heads": 2, **extra}, causal=True, window=w))
    return specs


Grids = tuple[list[AttentionSpec], list[AttentionSpec]]
# chapter notebook -> (its parameter defaults -> (main grid, other verified layouts))
CHAPTER_GRIDS: Mapping[str, Callable[[dict[str, Any]], Grids]] = {
    "chapters/02_one_head.ipynb": lambda p: (one_head(p["GRID_D"]), one_head_width_sweep(p["D_MODEL"], p["MAX_WIDTH"])),
    "chapters/03_many_heads.ipynb": lambda p: (many_heads(p["WIDTHS"]), []),
    "chapters/04_never_identified.ipynb": lambda p: (never_identified(p["WIDTHS"]), []),
    "chapters/05_biases.ipynb": lambda p: (biases(p["D_MODEL"]), []),
    "chapters/06_rope.ipynb": lambda p: (rope(p["D_MODEL"]), rope_bases(p["D_MODEL"], p["BASES"])),
    "chapters/07_gqa.ipynb": lambda p: (gqa(p["D_MODEL"], p["HEADS"]), []),
}
# Chapter 7b's grids (qk_norm, windows) are not certified by the appendix: with eps > 0 a QK-norm layout has
# identified directions whose relative singular values (about 1e-8) lie below the certificate's floor
# (attnid.rank.GRAM_FLOOR), so its decisions come from the full spectrum instead.


def output_gates(d_model: int) -> list[Any]:
    """Chapter 7b: both gates on MHA, GQA and MQA, bare and with every bias, full RoPE, a causal mask and a gate bias.

    Then three layouts the theorem singles out: a value head wider than the model (d_v > d), a value bias without
    b_O, and Qwen3-Next's shape (shared QK-norm, partial RoPE, elementwise gate).
    """
    from attnid.families.gated import GatedSpec, qwen3_next_spec

    specs = []
    for gate in ("elementwise", "headwise"):
        for heads, kv in ((2, 2), (4, 2), (4, 1)):
            for extra, gate_bias in ((dict(), False), (dict(bias="qkvo", rope_fraction=1.0, causal=True), True)):
                specs.append(GatedSpec(AttentionSpec.create(d_model, heads, kv_heads=kv, **extra), gate, gate_bias))
        specs.append(GatedSpec(AttentionSpec.create(d_model // 2, 1, head_dim=2, v_head_dim=d_model), gate))
        specs.append(GatedSpec(AttentionSpec.create(d_model, 2, kv_heads=1, bias="qkv", causal=True), gate, True))
    specs.append(qwen3_next_spec(heads=2, kv_heads=1, head_dim=d_model // 2, rope_fraction=0.5))
    return specs


def gate_layout(d_model: int, heads: int, gate: str) -> Any:
    """Chapter 7b's figure: the standard layout of ``heads`` heads, ungated ('none') or with a gate of that kind."""
    from attnid.families.gated import GatedSpec

    base = AttentionSpec.create(d_model, heads)
    return base if gate == "none" else GatedSpec(base, gate)


def alibi(d_model: int) -> list[Any]:
    """Chapter 7b: ALiBi on MHA, GQA and MQA, bare and with biases, causal and bidirectional, a window, d_k > d."""
    from attnid.families.alibi import AlibiSpec

    layouts = [dict(heads=2, causal=True), dict(heads=4, bias="qkvo", causal=True),
               dict(heads=4, kv_heads=2, bias="qkv", causal=True), dict(heads=4, kv_heads=1, bias="kv", causal=True),
               dict(heads=2, bias="qkvo"), dict(heads=2, bias="qkvo", causal=True, window=3),
               dict(heads=1, head_dim=d_model + 2, v_head_dim=2, bias="qk", causal=True)]
    return [AlibiSpec(AttentionSpec.create(d_model // 2 if "head_dim" in extra else d_model, **extra)) for extra in layouts]


def relative_bias(d_model: int) -> list[Any]:
    """Chapter 7b: T5-style relative bias tables on MHA, GQA and MQA, with and without biases, causal and not, a
    window, d_k > d; short inputs that leave buckets unseen and longer ones that reach them all."""
    from attnid.families.relbias import RelativeBiasSpec

    layouts = [(dict(heads=2), 8, 12, 3), (dict(heads=2), 8, 12, 10), (dict(heads=2, causal=True), 8, 12, 4),
               (dict(heads=2, causal=True), 6, 9, 12), (dict(heads=4, kv_heads=2, bias="qkvo", causal=True), 8, 12, 6),
               (dict(heads=4, kv_heads=1, bias="kv"), 7, 10, 5),
               (dict(heads=2, bias="qkvo", causal=True, window=3), 8, 10, 7),
               (dict(heads=1, head_dim=d_model + 2, v_head_dim=2, bias="qk"), 10, 20, 6)]
    return [RelativeBiasSpec(AttentionSpec.create(d_model // 2 if "head_dim" in extra else d_model, **extra),
                             buckets, distance, n) for extra, buckets, distance, n in layouts]


# Chapter 7c's latent-attention layouts (MLASpec fields without norm_eps): with and without a query latent, with and
# without RoPE, c below and at d, one head and three.
MLA_LAYOUTS: tuple[dict[str, Any], ...] = (
    dict(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, q_lora_rank=4),
    dict(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=4, v_head_dim=2, q_lora_rank=None),
    dict(d_model=8, heads=3, kv_lora_rank=3, qk_nope_head_dim=1, qk_rope_head_dim=2, v_head_dim=3, q_lora_rank=5),
    dict(d_model=6, heads=2, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=0, v_head_dim=1, q_lora_rank=3),
    dict(d_model=6, heads=1, kv_lora_rank=6, qk_nope_head_dim=2, qk_rope_head_dim=6, v_head_dim=2, q_lora_rank=None),
)
# Chapter 7c's published structures scaled down: DeepSeek-V2/V3 and Kimi K2 (a query latent), DeepSeek-V2-Lite (none).
MLA_SCALED: Mapping[str, dict[str, Any]] = {
    "DeepSeek-V2/V3, Kimi K2 (q-latent)": dict(d_model=12, heads=3, kv_lora_rank=4, q_lora_rank=6,
                                               qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2),
    "DeepSeek-V2-Lite (no q-latent)": dict(d_model=12, heads=2, kv_lora_rank=4, q_lora_rank=None,
                                           qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2),
}


def ball_certificate_cases(max_d_model: int) -> list[tuple[str, str, Any, int]]:
    """(family, chapter, layout, seed) for the ball-arithmetic certificates of the certificate appendix.

    Chapter 8's QK-norm grid with eps = 0 and eps = 1 (1 stands for every eps > 0), chapter 9's latent
    layouts and scaled structures with eps = 0 and 1, then every layout of chapters 2 to 7 up to
    ``max_d_model``, each at its chapter's seed and defaults (read from the chapter's parameters cell).
    """
    from attnid.families.mla import MLASpec

    from attnbook.paths import repo_root
    from attnbook.provenance import notebook_parameters

    def defaults(chapter: str) -> dict[str, Any]:
        return notebook_parameters(repo_root() / "chapters" / chapter)

    modern, latent = defaults("07b_modern_attention.ipynb"), defaults("07c_latent_attention.ipynb")
    cases: list[tuple[str, str, Any, int]] = [("QK-norm", "8", spec, modern["SEED"])
                                               for spec in qk_norm(modern["D_MODEL"], 1.0)]
    cases += [("latent", "9", MLASpec(norm_eps=eps, **layout), latent["SEED"])
              for layout in (*MLA_LAYOUTS, *MLA_SCALED.values()) for eps in (0.0, 1.0)]
    seen: set[tuple[AttentionSpec, int]] = set()
    for notebook, build in CHAPTER_GRIDS.items():
        params = notebook_parameters(repo_root() / notebook)
        main, other = build(params)
        for spec in main + other:
            if spec.d_model <= max_d_model and (spec, params["SEED"]) not in seen:
                seen.add((spec, params["SEED"]))
                cases.append(("multi-head", notebook.split("/")[-1][:2].lstrip("0"), spec, params["SEED"]))
    return cases
