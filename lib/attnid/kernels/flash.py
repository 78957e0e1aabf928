"""Triton kernels: FlashAttention-2 forward, backward, forward-mode (JVP) and the backward's own tangent, with GQA, RoPE and a sink.

Layout: q (B, H, N, D), k (B, G, N, D), v (B, G, N, DV); query head h reads key/value head
h // (H / G), by index, so K and V are never repeated in memory. RoPE (rotate-half, on the first
R columns) is applied to q and k as tiles are loaded, from float32 cos/sin tables (N, R) that were
computed in float64. Every kernel keeps float32 accumulators. Scores are carried in base-2 units
(times log2 e) so the online softmax can use exp2; the log-sum-exp handed between kernels is in
natural units.

Importing this module decides how Triton runs: compiled for CUDA, or, with TRITON_INTERPRET=1 set
before the import, simulated on the CPU with numpy (float32 only there; slow; for tests).
"""

from __future__ import annotations


import triton
import triton.language as tl
from triton import knobs


INTERPRETED: bool = bool(knobs.runtime.interpret)
# log2(e): the kernels work in base 2 (exp2, log2), so scores and logits are scaled by it.
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


# ----------------------------------------------------------------------------------------------
# Tile helpers (device functions the kernels share)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _load_rotated(ptr, pos, cols, stride_n, n_ctx, cos_ptr, sin_ptr, D: tl.constexpr, R: tl.constexpr, shift=0):
    """Rows `pos` of one head's (N, D) matrix as float32, RoPE applied to the first R columns at positions pos + shift.

    rotate-half: x_rot[c] = x[c] cos + sign(c) x[partner(c)] sin, partner(c) = c +- R/2,
    sign = -1 on the first half of the rotated columns, +1 on the second.
    """
    rows_ok = pos[:, None] < n_ctx
    x = tl.load(ptr + pos[:, None] * stride_n + cols[None, :], mask=rows_ok & (cols[None, :] < D), other=0.0)
    x = x.to(tl.float32)
    if R > 0:
        half: tl.constexpr = R // 2
        in_rope = rows_ok & (cols[None, :] < R)
        partner = tl.where(cols < half, cols + half, cols - half)
        sign = tl.where(cols < half, -1.0, 1.0)
        x_partner = tl.load(ptr + pos[:, None] * stride_n + partner[None, :], mask=in_rope, other=0.0)
        cos = tl.load(cos_ptr + (pos[:, None] + shift) * R + cols[None, :], mask=in_rope, other=1.0)
        sin = tl.load(sin_ptr + (pos[:, None] + shift) * R + cols[None, :], mask=in_rope, other=0.0)
        x = x * cos + sign[None, :] * x_partner.to(tl.float32) * sin
    return x


@triton.jit
def _unrotate(y, pos, cols, n_ctx, cos_ptr, sin_ptr, R: tl.constexpr, shift=0):
    """The transpose of RoPE applied to a float32 tile held in registers: y cos - rotate_half(y) sin.

    rotate_half(y)[:, c] = sign(c) y[:, partner(c)], gathered across the tile's columns.
    """
    half: tl.constexpr = R // 2
    partner = tl.where(cols < half, cols + half, tl.where(cols < R, cols - half, cols))
    sign = tl.where(cols < half, -1.0, tl.where(cols < R, 1.0, 0.0))
    y_partner = tl.gather(y, tl.broadcast_to(partner[None, :], y.shape), 1)
    in_rope = (pos[:, None] < n_ctx) & (cols[None, :] < R)
    cos = tl.load(cos_ptr + (pos[:, None] + shift) * R + cols[None, :], mask=in_rope, other=1.0)
    sin = tl.load(sin_ptr + (pos[:, None] + shift) * R + cols[None, :], mask=in_rope, other=0.0)
    return y * cos - sign[None, :] * y_partner * sin


@triton.jit
def _visible(offs_m, offs_n, n_k, shift, CAUSAL: tl.constexpr):
    """(BLOCK_M, BLOCK_N) mask of the (query, key) pairs that take part: keys in range, causal order.

    With N_q queries and N_k keys the causal mask is aligned to the end (query i sits at position
    i + shift, shift = N_k - N_q >= 0, and sees the keys j <= i + shift), as in decoding against a cache.
    Query rows past the end need no mask: they load as zeros (q, dO, delta), so they add nothing.
    """
    ok = offs_n[None, :] < n_k
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + shift)
    return ok


@triton.jit
def _mask_tile(Mask, b, h, rows, keys, n_q, n_k, stride_mb, stride_mh, stride_mm, stride_mn):
    """The additive mask's (rows x keys) tile of batch b and head h, float32, natural units (-inf hides a pair).

    A broadcast dimension of the mask has stride 0, so one (N_q, N_k) mask serves every batch and head.
    """
    ok = (rows[:, None] < n_q) & (keys[None, :] < n_k)
    ptrs = Mask + b * stride_mb + h * stride_mh + rows[:, None] * stride_mm + keys[None, :] * stride_mn
    return tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)


# ----------------------------------------------------------------------------------------------
# Forward (and, with TANGENT, the forward-mode derivative in the same pass)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _query_program(n_heads, group_size, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
                   BLOCK_M: tl.constexpr):
    """Where a program over (query blocks, B H) works: (start_m, bh, b, h, its queries, q_off, k_off, v_off).

    bh = b H + h is taken in 64 bits, so every offset is too (B H N D may exceed 2^31 elements); q_off is
    the query head's offset, k_off and v_off those of the key/value head g = h // group_size it shares.
    """
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    g = h // group_size
    queries = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_off = b * stride_qb + h * stride_qh
    k_off = b * stride_kb + g * stride_kh
    v_off = b * stride_vb + g * stride_vh
    return start_m, bh, b, h, queries, q_off, k_off, v_off


@triton.jit
def _tile_ranges(BLOCK: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr):
    """The index ranges inside a tile: the BLOCK rows of the side a program loops over, then the
    padded query/key and value columns."""
    return tl.arange(0, BLOCK), tl.arange(0, D_PAD), tl.arange(0, DV_PAD)


@triton.jit
def _key_end(KeyLen, b, n_k, start_m, shift, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr):
    """(kv_len, hi): the keys batch ``b`` has, and where a query block's loop over key blocks stops.

    Causal: key blocks wholly above the diagonal are never visited; nor blocks past the row's keys.
    """
    kv_len = n_k
    if HAS_LENGTHS:
        kv_len = tl.load(KeyLen + b)
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M + shift, kv_len)
    return kv_len, hi


@triton.jit
def _load_kv(K, V, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin,
             D: tl.constexpr, DV: tl.constexpr, R: tl.constexpr):
    """One key block: its keys, rotated at their positions, in K's dtype, and its values (zero past n_k); and the values' mask.

    (q, k, v and their tangents share one dtype: ``attnid.kernels.arguments`` checks it.)
    """
    k = _load_rotated(K + k_off, keys, cols, stride_kn, n_k, Cos, Sin, D, R).to(K.dtype.element_ty)
    v_mask = (keys[:, None] < n_k) & (cols_v[None, :] < DV)
    v = tl.load(V + v_off + keys[:, None] * stride_vn + cols_v[None, :], mask=v_mask, other=0.0)
    return k, v, v_mask


@triton.jit
def _scores(q, k, qk_scale, Mask, b, h, rows, keys, n_q, n_k, stride_mb, stride_mh, stride_mm, stride_mn,
            HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """The (rows x keys) scores in base-2 units, with the additive mask's tile where there is a mask."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if HAS_MASK:
        s += _mask_tile(Mask, b, h, rows, keys, n_q, n_k, stride_mb, stride_mh, stride_mm, stride_mn) * LOG2E
    return s


@triton.jit
def _product_tangent(a, ta, b, tb, PRECISION: tl.constexpr):
    """The tangent of a b^T along (ta, tb): ta b^T + a tb^T, float32."""
    return tl.dot(ta, tl.trans(b), input_precision=PRECISION) + tl.dot(a, tl.trans(tb), input_precision=PRECISION)


@triton.jit
def _forward_kernel(
    Q, K, V, TQ, TK, TV, Sink, Cos, Sin, Out, TOut, Lse, TLse, Mask, KeyLen,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on, stride_mb, stride_mh, stride_mm, stride_mn,
    n_q, n_k, n_heads, group_size, scale,
    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr, R: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SINK: tl.constexpr, TANGENT: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_LENGTHS: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head). Online softmax over key blocks.

    With TANGENT it also carries, for tangents (tq, tk, tv), the score tangent
    ds = (tq k^T + q tk^T) scale and three more accumulators rescaled like the others:
    g = sum p ds, acc_t = sum (p ds) v + p tv. Then tangent_out = acc_t / l - (g / l) out, and
    g / l is the tangent of the log-sum-exp (stored in TLse; the backward's tangent needs it).

    HAS_MASK adds an additive mask tile to the scores; HAS_LENGTHS hides the keys j >= KeyLen[b]. A row
    that sees no key (and has no sink) gets out = 0 and lse = +inf, so the backward gives it no weight.
    """
    start_m, bh, b, h, offs_m, q_off, k_off, v_off = _query_program(n_heads, group_size, stride_qb, stride_qh, stride_kb,
                                                                    stride_kh, stride_vb, stride_vh, BLOCK_M)
    dtype = Q.dtype.element_ty
    offs_n, cols, cols_v = _tile_ranges(BLOCK_N, D_PAD, DV_PAD)
    shift = n_k - n_q  # query i sits at position i + shift (causal: sees keys j <= i + shift)
    q = _load_rotated(Q + q_off, offs_m, cols, stride_qn, n_q, Cos, Sin, D, R, shift).to(dtype)
    qk_scale = scale * LOG2E  # scores in base-2 units

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    if TANGENT:
        tq = _load_rotated(TQ + q_off, offs_m, cols, stride_qn, n_q, Cos, Sin, D, R, shift).to(dtype)
        g_i = tl.zeros([BLOCK_M], tl.float32)
        acc_t = tl.zeros([BLOCK_M, DV_PAD], tl.float32)

    kv_len, hi = _key_end(KeyLen, b, n_k, start_m, shift, BLOCK_M, CAUSAL, HAS_LENGTHS)
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n
        k, v, v_mask = _load_kv(K, V, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin, D, DV, R)
        visible = _visible(offs_m, keys, kv_len, shift, CAUSAL)
        s = _scores(q, k, qk_scale, Mask, b, h, offs_m, keys, n_q, n_k, stride_mb, stride_mh, stride_mm, stride_mn,
                    HAS_MASK, PRECISION)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: no -inf - -inf
        alpha = tl.exp2(m_i - m_safe)  # rescales everything accumulated so far
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(dtype), v, input_precision=PRECISION)
        if TANGENT:
            tk, tv, _ = _load_kv(TK, TV, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin, D, DV, R)
            t_s = _product_tangent(q, tq, k, tk, PRECISION) * scale
            pds = p * tl.where(visible, t_s, 0.0)
            g_i = g_i * alpha + tl.sum(pds, 1)
            acc_t = acc_t * alpha[:, None] + tl.dot(pds.to(dtype), v, input_precision=PRECISION)
            acc_t += tl.dot(p.to(dtype), tv, input_precision=PRECISION)
        m_i = m_new

    if HAS_SINK:  # one more logit per head, in the denominator only
        sink = tl.load(Sink + h).to(tl.float32) * LOG2E
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.exp2(sink - m_new)
        acc = acc * alpha[:, None]
        if TANGENT:
            g_i = g_i * alpha
            acc_t = acc_t * alpha[:, None]
        m_i = m_new

    empty = l_i == 0.0  # a row that sees no key and has no sink
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    rows_ok = offs_m < n_q
    o_ptrs = b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + cols_v[None, :]
    o_mask = rows_ok[:, None] & (cols_v[None, :] < DV)
    tl.store(Out + o_ptrs, out.to(Out.dtype.element_ty), mask=o_mask)
    lse = tl.where(empty, float("inf"), (m_i + tl.log2(l_safe)) / LOG2E)
    tl.store(Lse + bh * n_q + offs_m, lse, mask=rows_ok)
    if TANGENT:
        t_out = acc_t / l_safe[:, None] - (g_i / l_safe)[:, None] * out
        tl.store(TOut + o_ptrs, t_out.to(TOut.dtype.element_ty), mask=o_mask)
        tl.store(TLse + bh * n_q + offs_m, g_i / l_safe, mask=rows_ok)


# ----------------------------------------------------------------------------------------------
# Backward: dK and dV per key block (summed over the group's query heads), then dQ per query block
# ----------------------------------------------------------------------------------------------


@triton.jit
def _load_query_rows(Q, DO, Lse, Delta, q_off, o_off, row_off, queries, cols, cols_v, stride_qn, stride_on, n_q, Cos, Sin,
                     shift, D: tl.constexpr, DV: tl.constexpr, R: tl.constexpr):
    """What the backward reads of a query block: q (rotated, in Q's dtype), dO, and the rows' lse and delta (zero past n_q)."""
    q = _load_rotated(Q + q_off, queries, cols, stride_qn, n_q, Cos, Sin, D, R, shift).to(Q.dtype.element_ty)
    do_mask = (queries[:, None] < n_q) & (cols_v[None, :] < DV)
    do = tl.load(DO + o_off + queries[:, None] * stride_on + cols_v[None, :], mask=do_mask, other=0.0)
    lse = tl.load(Lse + row_off + queries, mask=queries < n_q, other=0.0)
    delta = tl.load(Delta + row_off + queries, mask=queries < n_q, other=0.0)
    return q, do, lse, delta


@triton.jit
def _backward_dkdv_kernel(
    Q, K, V, DO, Lse, Delta, Cos, Sin, DK, DV_out, TQ, TK, TV, TDO, TLse, TDelta, TDK, TDV_out, Mask, KeyLen,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on, stride_mb, stride_mh, stride_mm, stride_mn,
    n_q, n_k, n_heads, n_kv_heads, group_size, scale,
    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr, R: tl.constexpr,
    CAUSAL: tl.constexpr, TANGENT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LENGTHS: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: BLOCK_N keys of one (batch, key/value head); loops over every query of the group.

    Works with transposed scores sT (keys x queries): pT = exp(sT - lse), dV += pT dO,
    dsT = pT (V dO^T - delta), dK_rot += dsT q_rot scale, then dK = RoPE^T dK_rot.

    With TANGENT it also carries the forward-mode derivative of all of this along tangents
    (tq, tk, tv, tdO), with the rows' tangents t_lse and t_delta given: t_sT = (tk q^T + k tq^T) scale,
    t_pT = pT (t_sT - t_lse), t_dV += t_pT dO + pT tdO, t_dsT = t_pT (dpT - delta) + pT (t_dpT - t_delta)
    with t_dpT = tv dO^T + v tdO^T, and t_dK_rot += t_dsT q_rot + dsT tq_rot (times scale).
    """
    start_n = tl.program_id(0)
    bg = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B H N D may exceed 2^31 elements
    b = bg // n_kv_heads
    g = bg % n_kv_heads
    dtype = K.dtype.element_ty
    keys = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m, cols, cols_v = _tile_ranges(BLOCK_M, D_PAD, DV_PAD)
    k_off = b * stride_kb + g * stride_kh
    v_off = b * stride_vb + g * stride_vh
    shift = n_k - n_q
    kv_len = n_k
    if HAS_LENGTHS:
        kv_len = tl.load(KeyLen + b)
    k, v, v_mask = _load_kv(K, V, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin, D, DV, R)
    dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dv = tl.zeros([BLOCK_N, DV_PAD], tl.float32)
    qk_scale = scale * LOG2E
    if TANGENT:
        tk, tv, _ = _load_kv(TK, TV, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin, D, DV, R)
        t_dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
        t_dv = tl.zeros([BLOCK_N, DV_PAD], tl.float32)

    # Causal: query blocks wholly before this key block cannot see it.
    lo = 0
    if CAUSAL:  # query i sees key j when i >= j - shift
        lo = (tl.maximum(start_n * BLOCK_N - shift, 0) // BLOCK_M) * BLOCK_M
    for hh in range(0, group_size):
        h = g * group_size + hh
        q_off = b * stride_qb + h * stride_qh
        o_off = b * stride_ob + h * stride_oh
        row_off = (b * n_heads + h) * n_q
        for start_m in range(lo, n_q, BLOCK_M):
            queries = start_m + offs_m
            q, do, lse, delta = _load_query_rows(Q, DO, Lse, Delta, q_off, o_off, row_off, queries, cols, cols_v,
                                                 stride_qn, stride_on, n_q, Cos, Sin, shift, D, DV, R)
            s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
            if HAS_MASK:
                s_t += tl.trans(_mask_tile(Mask, b, h, queries, keys, n_q, n_k, stride_mb, stride_mh, stride_mm,
                                           stride_mn)) * LOG2E
            p_t = tl.exp2(s_t - lse[None, :] * LOG2E)
            p_t = tl.where(tl.trans(_visible(queries, keys, kv_len, shift, CAUSAL)), p_t, 0.0)
            dv += tl.dot(p_t.to(dtype), do, input_precision=PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t.to(dtype), q, input_precision=PRECISION)
            if TANGENT:
                tq, tdo, t_lse, t_delta = _load_query_rows(TQ, TDO, TLse, TDelta, q_off, o_off, row_off, queries, cols,
                                                           cols_v, stride_qn, stride_on, n_q, Cos, Sin, shift, D, DV, R)
                t_s = _product_tangent(k, tk, q, tq, PRECISION) * scale
                t_p = p_t * (t_s - t_lse[None, :])  # zero wherever p_t is (masked pairs)
                t_dv += tl.dot(t_p.to(dtype), do, input_precision=PRECISION)
                t_dv += tl.dot(p_t.to(dtype), tdo, input_precision=PRECISION)
                t_dp = _product_tangent(v, tv, do, tdo, PRECISION)
                t_ds = t_p * (dp_t - delta[None, :]) + p_t * (t_dp - t_delta[None, :])
                t_dk += tl.dot(t_ds.to(dtype), q, input_precision=PRECISION)
                t_dk += tl.dot(ds_t.to(dtype), tq, input_precision=PRECISION)

    dk = dk * scale
    if R > 0:
        dk = _unrotate(dk, keys, cols, n_k, Cos, Sin, R)
    k_mask = (keys[:, None] < n_k) & (cols[None, :] < D)
    tl.store(DK + k_off + keys[:, None] * stride_kn + cols[None, :], dk.to(DK.dtype.element_ty), mask=k_mask)
    tl.store(DV_out + v_off + keys[:, None] * stride_vn + cols_v[None, :], dv.to(DV_out.dtype.element_ty), mask=v_mask)
    if TANGENT:
        t_dk = t_dk * scale
        if R > 0:
            t_dk = _unrotate(t_dk, keys, cols, n_k, Cos, Sin, R)
        tl.store(TDK + k_off + keys[:, None] * stride_kn + cols[None, :], t_dk.to(TDK.dtype.element_ty), mask=k_mask)
        tl.store(TDV_out + v_off + keys[:, None] * stride_vn + cols_v[None, :], t_dv.to(TDV_out.dtype.element_ty),
                 mask=v_mask)


@triton.jit
def _backward_dq_kernel(
    Q, K, V, DO, Lse, Delta, Cos, Sin, DQ, TQ, TK, TV, TDO, TLse, TDelta, TDQ, Mask, KeyLen,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on, stride_mb, stride_mh, stride_mm, stride_mn,
    n_q, n_k, n_heads, group_size, scale,
    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr, R: tl.constexpr,
    CAUSAL: tl.constexpr, TANGENT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LENGTHS: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head). dQ_rot = sum_keys ds k_rot scale, then RoPE^T.

    With TANGENT, also t_dQ_rot = sum_keys (t_ds k_rot + ds tk_rot) scale, t_ds as in the dK/dV kernel.
    """
    start_m, bh, b, h, queries, q_off, k_off, v_off = _query_program(n_heads, group_size, stride_qb, stride_qh, stride_kb,
                                                                     stride_kh, stride_vb, stride_vh, BLOCK_M)
    dtype = Q.dtype.element_ty
    offs_n, cols, cols_v = _tile_ranges(BLOCK_N, D_PAD, DV_PAD)
    o_off = b * stride_ob + h * stride_oh
    shift = n_k - n_q
    row_off = bh * n_q
    q, do, lse, delta = _load_query_rows(Q, DO, Lse, Delta, q_off, o_off, row_off, queries, cols, cols_v, stride_qn,
                                         stride_on, n_q, Cos, Sin, shift, D, DV, R)
    dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    qk_scale = scale * LOG2E
    if TANGENT:
        tq, tdo, t_lse, t_delta = _load_query_rows(TQ, TDO, TLse, TDelta, q_off, o_off, row_off, queries, cols, cols_v,
                                                   stride_qn, stride_on, n_q, Cos, Sin, shift, D, DV, R)
        t_dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)

    kv_len, hi = _key_end(KeyLen, b, n_k, start_m, shift, BLOCK_M, CAUSAL, HAS_LENGTHS)
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n
        k, v, _ = _load_kv(K, V, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin, D, DV, R)
        s = _scores(q, k, qk_scale, Mask, b, h, queries, keys, n_q, n_k, stride_mb, stride_mh, stride_mm, stride_mn,
                    HAS_MASK, PRECISION)
        p = tl.exp2(s - lse[:, None] * LOG2E)
        p = tl.where(_visible(queries, keys, kv_len, shift, CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(dtype), k, input_precision=PRECISION)
        if TANGENT:
            tk, tv, _ = _load_kv(TK, TV, k_off, v_off, keys, cols, cols_v, stride_kn, stride_vn, n_k, Cos, Sin, D, DV, R)
            t_s = _product_tangent(q, tq, k, tk, PRECISION) * scale
            t_p = p * (t_s - t_lse[:, None])
            t_dp = _product_tangent(do, tdo, v, tv, PRECISION)
            t_ds = t_p * (dp - delta[:, None]) + p * (t_dp - t_delta[:, None])
            t_dq += tl.dot(t_ds.to(dtype), k, input_precision=PRECISION)
            t_dq += tl.dot(ds.to(dtype), tk, input_precision=PRECISION)

    dq = dq * scale
    if R > 0:
        dq = _unrotate(dq, queries, cols, n_q, Cos, Sin, R, shift)
    q_mask = (queries[:, None] < n_q) & (cols[None, :] < D)
    tl.store(DQ + q_off + queries[:, None] * stride_qn + cols[None, :], dq.to(DQ.dtype.element_ty), mask=q_mask)
    if TANGENT:
        t_dq = t_dq * scale
        if R > 0:
            t_dq = _unrotate(t_dq, queries, cols, n_q, Cos, Sin, R, shift)
        tl.store(TDQ + q_off + queries[:, None] * stride_qn + cols[None, :], t_dq.to(TDQ.dtype.element_ty), mask=q_mask)
