"""What a numeric check will draw and need, decided before anything is allocated.

The input sizes a check draws by default (``default_seq_len``, ``default_inputs``), the argument
checks every route shares (``check_arguments``), and the peak-memory estimate of each route of
``attnid.verification.numeric_rank`` (``estimate_resources``), with the error a route raises instead
of running past a memory limit (``MemoryLimitExceeded``). The exact count's total is passed in where
the caller already has it, never recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnid import gram_blocks, structured
from attnid.counts import Count, count, sink_corner_trade
from attnid.spec import AttentionSpec

MIN_SEQ_LEN = 2
MIN_CAUSAL_ROPE_SEQ_LEN = 3  # chapter 6: with a causal mask, RoPE needs two offsets one apart
MAX_EXTRA_ROUNDS = 6
METHODS = ("auto", "dense", "svd")
FLOAT64_BYTES = 8

def default_seq_len(spec: AttentionSpec) -> int:
    """Tokens per input: d_model, kept between 8 and 32 (longer inputs carry more score information)."""
    return max(8, min(spec.d_model, 32))


def default_inputs(spec: AttentionSpec, seq_len: int, total: int | None = None) -> int:
    """A first batch of inputs: 1.5 times the larger of two estimates of how many the rank needs, plus one.

    * Outputs: each output row is b_O plus a combination of the rows of the H W_O^h, so apart
      from W_O and b_O an input adds at most seq_len * min(d_model, H d_v) independent rows.
    * Scores: the query/key weights act only through the scores, and per head an input has
      n (n - 1) score differences that a softmax can see (n^2 for sigmoid or a sink; about
      half with a causal mask), while the query/key side has up to (H + G)(d_model + 1) d_k
      parameters to pin down.

    Just enough inputs leaves the last directions weakly seen (singular values near the
    zero tolerance); the margin keeps them clear of it, so the rank settles in one batch.
    """
    n, h = seq_len, spec.heads
    width = min(spec.d_model, h * spec.v_head_dim)
    total = count(spec).total if total is None else total
    by_outputs = math.ceil(total / (n * width))
    visible = n * (n - 1) if spec.shift_invariant else n * n
    if spec.causal:
        visible = max(1, visible // 2)
    qk_params = (h + spec.kv_heads) * (spec.d_model + 1) * spec.head_dim
    by_scores = math.ceil(qk_params / (h * visible))
    return math.ceil(1.5 * max(by_outputs, by_scores)) + 1


def check_arguments(spec: AttentionSpec, seq_len: int | None, n_inputs: int | None, method: str,
                    total: int | None = None) -> tuple[int, int]:
    """(seq_len, n_inputs) with defaults filled in; ValueError for a bad seq_len, n_inputs or method.

    ``total``: the layout's parameter count, where the caller has it (else counted here)."""
    seq_len = default_seq_len(spec) if seq_len is None else seq_len
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < MIN_SEQ_LEN:
        raise ValueError(f"seq_len must be an integer >= {MIN_SEQ_LEN} (attention over one token is constant), got {seq_len!r}")
    if spec.rope_dims and spec.causal and seq_len < MIN_CAUSAL_ROPE_SEQ_LEN:
        raise ValueError(f"seq_len must be >= {MIN_CAUSAL_ROPE_SEQ_LEN} for a causal layout with RoPE, got {seq_len}: with "
                         "two tokens the only offset is 1 and the fiber is larger than the exact count (chapter 6)")
    n_inputs = default_inputs(spec, seq_len, total) if n_inputs is None else n_inputs
    if isinstance(n_inputs, bool) or not isinstance(n_inputs, int) or n_inputs < 1:
        raise ValueError(f"n_inputs must be a positive integer, got {n_inputs!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return seq_len, n_inputs



ESTIMATE_FIRST_USE_BYTES = 256 * 2**20
ESTIMATE_SAFETY = 1.25
ESTIMATE_HEAP_SLACK_CAP = 256 * 2**20


@dataclass(frozen=True)
class Estimate:
    """The predicted peak memory of ``numeric_rank`` (so of ``verify``) for one layout and input size.

    ``bytes`` is the prediction (an upper bound by calibration, see ``estimate_resources``);
    ``terms`` gives the float64 element count of each term of the formula before the safety
    factor, and ``jacobian_mode`` the mode ``input_jacobian`` will pick ('forward' or 'reverse').
    """

    bytes: int
    n_params: int
    seq_len: int
    n_inputs: int
    jacobian_mode: str
    terms: dict[str, int]

    def human(self) -> str:
        """The estimate in readable units, e.g. '12.9 GiB'."""
        return format_bytes(self.bytes)


class MemoryLimitExceeded(ValueError):
    """A route of ``numeric_rank`` would need more memory than its ``max_bytes``; raised before the route runs."""

    def __init__(self, route: str, estimate: Estimate, limit: int) -> None:
        self.route, self.estimate, self.limit = route, estimate, limit
        super().__init__(f"the {route} route needs about {estimate.human()} of memory (estimated peak, "
                         f"{estimate.n_params:,} parameters, {estimate.n_inputs} inputs of {estimate.seq_len} tokens), "
                         f"above the limit of {format_bytes(limit)}")


def guard(route: str, spec: AttentionSpec, seq_len: int, n_inputs: int, max_bytes: int | None,
          exact: Count | None = None) -> None:
    """Raise MemoryLimitExceeded when ``route``'s estimated peak exceeds ``max_bytes`` (None: no limit)."""
    if max_bytes is None:
        return
    estimate = estimate_resources(spec, seq_len, n_inputs, method="auto" if route == "structured" else route,
                                  exact=exact)
    if estimate.bytes > max_bytes:
        raise MemoryLimitExceeded(route, estimate, max_bytes)


def format_bytes(n: int | float) -> str:
    """A byte count in binary units, three digits where the value allows: '512 B', '1.50 KiB', '12.9 GiB', '1000 GiB'."""
    value, units = float(n), ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    for unit in units:
        if abs(value) < 1024 or unit == units[-1]:
            if unit == "B":
                return f"{value:.0f} B"
            return f"{value:.{2 if abs(value) < 10 else 1 if abs(value) < 100 else 0}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def orbit_generator_count(spec: AttentionSpec) -> tuple[int, int]:
    """(generators, RoPE commutant basis size) that ``symmetry.labelled_tangent_directions`` builds (an upper bound).

    Per group: the commutant basis (r + (d_k - r)^2 matrices), d_v^2 value/output generators,
    d_k - r key-bias shifts and d_v value-bias trades where plain softmax allows them; without
    b_O at most G d_v value-bias directions in all. With a QK-norm, instead of the commutant and
    the key-bias shifts: m + 1 projection scales and r/2 + d_k - r norm-weight trades per group
    (an upper bound for every variant); one sink-corner trade per head where counted.
    Arithmetic only: nothing is allocated.
    """
    dk, dv, r = spec.head_dim, spec.v_head_dim, spec.rope_dims
    commutant = 0 if spec.has_qk_norm else r + (dk - r) ** 2
    per_group = commutant + dv * dv
    if spec.has_qk_norm:  # QK-norm: per-head scales and norm-weight trades instead of the commutant
        per_group += spec.group_size + 1 + (r // 2 + dk - r) + (dk - r) ** 2
    if spec.shift_invariant and spec.has_bias("k") and not spec.has_qk_norm:
        per_group += dk - r
    if spec.shift_invariant and spec.has_bias("v") and spec.has_bias("o"):
        per_group += dv
    generators = spec.kv_heads * per_group
    if spec.shift_invariant and spec.has_bias("v") and not spec.has_bias("o"):
        generators += spec.kv_heads * dv
    return generators + sink_corner_trade(spec), commutant


def _gesdd_floats(rows: int, cols: int, *, vectors: bool) -> int:
    """LAPACK gesdd on a rows x cols float64 matrix: the input copy, the factors and the documented minimum workspace."""
    k, big = min(rows, cols), max(rows, cols)
    if not vectors:  # JOBZ='N': LWORK >= 3k + max(big, 7k)
        return rows * cols + 3 * k + max(big, 7 * k)
    return rows * cols + rows * k + k * cols + 3 * k * k + max(big, 4 * k * k + 4 * k)  # JOBZ='S'


def _jacobian_floats(spec: AttentionSpec, seq_len: int, n_params: int) -> tuple[str, int]:
    """(mode, float64 elements) for one input's Jacobian block as ``input_jacobian`` computes it (mode 'auto')."""
    n, h, g = seq_len, spec.heads, spec.kv_heads
    rows = n * spec.d_model
    forward_mode = n_params <= rows  # input_jacobian's rule for mode 'auto'
    batch = n_params if forward_mode else rows  # jacfwd pushes P tangents, jacrev pulls back one cotangent per row
    # per batched tangent/cotangent: scores, masked scores, weights and softmax temporaries (H n^2 each,
    # one more column with a sink), and the per-head queries, keys, values and their RoPE temporaries
    per_item = 4 * h * n * (n + 1) + (4 if forward_mode else 2) * n * (h + g) * (spec.head_dim + spec.v_head_dim)
    # the block (rows x P) and its copies: the transposed output of jacfwd; in reverse mode the slice
    # gradients of every parameter tensor, each as wide as theta, before they are summed
    block = (3 if forward_mode else 6) * rows * n_params
    return ("forward" if forward_mode else "reverse"), block + batch * batch + batch * per_item


def estimate_resources(spec: AttentionSpec, seq_len: int | None = None, n_inputs: int | None = None,
                       method: str = "auto", exact: Count | None = None) -> Estimate:
    """Predict the peak memory of ``numeric_rank(spec, seq_len=..., n_inputs=..., method=...)`` without allocating.

    Arguments as in ``numeric_rank`` (defaults filled in the same way; a bad one raises the same
    ValueError). Notation: P = count(spec).total parameters, n = seq_len, m = n d_model rows per
    input, N = n_inputs, u = the orbit generators (``orbit_generator_count``, 0 when the layout
    has no exact count and so no orbit basis), k = min(P, u) columns of the orbit basis, J = one
    input's Jacobian work (``_jacobian_floats``: 6 m P + m^2 + m (4 H n (n+1) + 2 n (H+G)(d_k+d_v))
    in reverse mode, 3 m P + P^2 + P (4 H n (n+1) + 4 n (H+G)(d_k+d_v)) in forward mode, which
    ``input_jacobian`` picks when P <= m). In float64 elements:

        live        = P + (N + N_last) n d_model + P k        point, inputs (N_last: the last extra round), basis
        orbit       = 2 c d_k^2 + 3 u P + gesdd(P x u) - P k  commutant basis (c matrices), generators,
                                                              their flat copies and stack, the SVD
        certificate = max(2 P^2 + J, 6 P^2) + N m k           Gram, K, two Cholesky factors, the shifted K and
                                                              its identity; J T for every input
        svd         = max((7 P + 3 m) P, 2 P^2 + (P + m) P + J + m k)
                                                              the running QR: R, up to P + m pending rows,
                                                              their concatenation and LAPACK's copy, the new R

    (the certificate term only for method 'auto' on a layout with an exact count), and with
    F = 8 (live + max(orbit, certificate, svd)) bytes of float64 elements,

        bytes = ESTIMATE_FIRST_USE_BYTES + ESTIMATE_SAFETY F + min(F, ESTIMATE_HEAP_SLACK_CAP).

    What it bounds: the peak resident memory of a process running ``verify`` once, minus the
    process's memory after ``import attnid`` (the interpreter, torch and the library). Calibration
    (2 CPU threads, glibc, torch 2.13 CPU; a fresh process each, peak from the kernel's VmHWM):

        layout (route)                                  measured   F          estimate
        d_model 8,  2 heads (certificate)                170 MiB     4.0 MiB   265 MiB
        d_model 8,  2 heads, qkvo, learned sink          171 MiB     5.1 MiB   267 MiB
        d_model 16, 2 heads (certificate)                277 MiB      64 MiB   400 MiB
        d_model 16, 4 heads, qkvo (certificate)          317 MiB      71 MiB   416 MiB
        d_model 20, 2 heads (certificate)                489 MiB     156 MiB   608 MiB
        d_model 24, 4 heads, qkvo (certificate)          588 MiB     346 MiB   944 MiB
        d_model 24, 1 head, d_k 26, RoPE (SVD route)     601 MiB     340 MiB   936 MiB
        d_model 32, 2 heads (certificate)               1159 MiB    1024 MiB  1792 MiB
        d_model 32, 2 heads, RoPE base 10^8 (SVD)       1230 MiB    1009 MiB  1774 MiB

    About 165 MiB of each measurement is the first-use cost; the rest ranged from 0.9 F (the
    largest layouts) to 2.1 F (P x P below the mmap threshold). Nothing is allocated here: the
    estimate is arithmetic on the layout, fast for any size. It is for the CPU; on a GPU the
    same terms bound the device memory.
    """
    c = count(spec) if exact is None else exact
    seq_len, n_inputs = check_arguments(spec, seq_len, n_inputs, method, c.total)
    p, n, d = c.total, seq_len, spec.d_model
    rows = n * d
    generators, commutant = orbit_generator_count(spec) if c.covered else (0, 0)
    k = min(p, generators)
    last_extra, total = 0, n_inputs
    for _ in range(MAX_EXTRA_ROUNDS):  # the inputs of the SVD route's last round, alive next to the first batch
        last_extra = max(1, total // 2)
        total += last_extra
    mode, jac = _jacobian_floats(spec, seq_len, p)
    live = p + (n_inputs + last_extra) * n * d + p * k
    orbit = 0
    if c.covered:
        orbit = 2 * commutant * spec.head_dim**2 + 3 * generators * p + _gesdd_floats(p, generators, vectors=True) - p * k
        if spec.shift_invariant and spec.has_bias("v") and not spec.has_bias("o"):
            bv = spec.kv_heads * spec.v_head_dim
            orbit += _gesdd_floats(d, bv, vectors=True) + bv * bv  # full_matrices: V^T is (G d_v)^2
    certificate = max(2 * p * p + jac, 6 * p * p) + n_inputs * rows * k if c.covered and method in ("auto", "dense") else 0
    svd = max((7 * p + 3 * rows) * p, 2 * p * p + (p + rows) * p + jac + rows * k)
    if method == "auto" and c.covered and structured.covers(spec) is None:
        return _structured_estimate(spec, seq_len, n_inputs, generators, p)
    terms = {"live": live, "orbit": orbit, "jacobian": jac, "certificate": certificate, "svd": svd}
    terms_bytes = FLOAT64_BYTES * (live + max(orbit, certificate, svd))
    total_bytes = (ESTIMATE_FIRST_USE_BYTES + math.ceil(ESTIMATE_SAFETY * terms_bytes)
                   + min(terms_bytes, ESTIMATE_HEAP_SLACK_CAP))
    return Estimate(total_bytes, p, seq_len, n_inputs, mode, terms)


def _structured_estimate(spec: AttentionSpec, seq_len: int, n_inputs: int, generators: int, p: int) -> Estimate:
    """The peak memory of the structured route (``attnid.structured``), for its largest attempt.

    In float64 elements, with t = max(structured.INPUT_FACTORS) n_inputs n tokens, P parameters,
    T = H / G, per-head widths d_k, d_v, u generators and s the largest parameter tensor:

        gram     = P^2                              the Gram matrix (the attempts without gauge deletion)
        blocks   = 3 s^2 + M                        a Gram block, its reordered copy and its triangle; M
                                                    the moment of ``_explicit_by_fixed``: d s H d_v, plus
                                                    d G (d + 1) d_k H (d + 1) with RoPE (explicit W_K)
        factors  = 2 t (F_Q + F_K + 4 H (d + 1))     R of W_Q (F_Q = H d_k d, twice with b_Q), of W_K
                                                    (F_K = H (d + 1) d without RoPE, G (d + 1) d_k d with
                                                    it) and the L factors; twice: the inputs' factors and
                                                    their joined copy are alive together
        input    = 4 H n^2 d + 2 n H (d + 1) d_k d   one input's U, rotated keys and queries, W_K rows
        chunks   = min(4 * gram_blocks.CHUNK_ELEMENTS, 2 (gram + blocks + factors))   the chunked temporaries
        orbit    = 3 u P                            the generators, flattened and stacked

    and bytes = ESTIMATE_FIRST_USE_BYTES + ESTIMATE_SAFETY F + min(F, ESTIMATE_HEAP_SLACK_CAP) with
    F = 8 (sum of the terms), as for the dense route (``estimate_resources``). It covers the
    structured route only: a layout it gives up on goes to the dense route, whose own estimate
    (``method='dense'``) is far larger at d_model = 64, and which ``numeric_rank(max_bytes=...)``
    checks against the limit before it starts. Measured peaks (same conditions as the dense
    table; the estimate counts the largest attempt, 8 times the first batch of inputs):

        layout (attempt that decided)                   measured   estimate
        d_model 32,  8 heads (2x inputs)                  587 MiB   1775 MiB
        d_model 32,  1 head, RoPE, qkvo (about 5x)       1188 MiB   3109 MiB
        d_model 32, 32 heads (2x)                         847 MiB   2757 MiB
        d_model 64,  8 heads (2x, gauge deleted)         2951 MiB   7537 MiB
        d_model 64,  8 heads, qkvo (2x, gauge deleted)   3340 MiB   8371 MiB

    The margin is the price of covering the last attempt (8x) and every temporary; a tighter
    estimate would need the attempt that will decide, which is not known in advance.
    """
    n, d, h, g = seq_len, spec.d_model, spec.heads, spec.kv_heads
    dk, dv = spec.head_dim, spec.v_head_dim
    tokens = max(structured.INPUT_FACTORS) * n_inputs * n
    sizes = [h * (d + 1) * dk, g * (d + 1) * dk, g * (d + 1) * dv, h * dv * d]
    key = g * (d + 1) * dk * d if spec.rope_dims else h * (d + 1) * d
    query = h * dk * d * (2 if spec.has_bias("q") else 1)  # b_Q's R is a second copy of W_Q's once joined
    moment = d * max(sizes) * h * dv + (d * g * (d + 1) * dk * h * (d + 1) if spec.rope_dims else 0)
    terms = {"gram": p * p, "blocks": 3 * max(sizes) ** 2 + moment,
             "factors": 2 * tokens * (query + key + 4 * h * (d + 1)),
             "input": 4 * h * n * n * d + 2 * n * h * (d + 1) * dk * d, "orbit": 3 * generators * p}
    # the chunked temporaries: at most 4 chunks, and never more than twice what they are cut from
    terms["chunks"] = min(4 * gram_blocks.CHUNK_ELEMENTS, 2 * (terms["gram"] + terms["blocks"] + terms["factors"]))
    floats_bytes = FLOAT64_BYTES * sum(terms.values())
    total_bytes = (ESTIMATE_FIRST_USE_BYTES + math.ceil(ESTIMATE_SAFETY * floats_bytes)
                   + min(floats_bytes, ESTIMATE_HEAP_SLACK_CAP))
    return Estimate(total_bytes, p, seq_len, n_inputs, "structured", terms)
