"""Computer proofs of a Jacobian's rank in ball arithmetic: the true Jacobian, not its floating-point image.

At an exactly representable point (float64 parameters and inputs are dyadic rationals) the
layer's outputs and their directional derivatives are evaluated in arb ball arithmetic
(python-flint): every number is an interval [m - r, m + r] that provably contains the exact real
value, so exp, sqrt, cos and sin of the true layer are enclosed, not approximated. For the
directions B, the columns of a float64 basis of the complement of the orbit's tangent (any
P x (P - u) matrix would do; only its rank matters), the balls enclose every entry of J B, with
J the exact Jacobian of the outputs on the chosen inputs. If the determinant of the Gram matrix
(J B)^T (J B), computed in ball arithmetic, does not contain 0, then J B has full column rank,
so rank J >= P - u is proved: no rounding assumption enters.

What this proves about the layout: the minor is a real-analytic function of the parameters that
is not zero at this point, so rank J >= P - u on an open dense set of parameters, and the
Jacobian on all inputs (which has J's rows among its own) has nullity at most u at every such
point. With the u independent symmetry directions the book's theorems give (their invariance and
their number are proved by hand; ``BallCertificate.orbit`` checks the generators here are that
many), the count u is proved for that layout. The symmetries only choose B: the rank bound holds
for any B, so a missing generator cannot make a wrong rank bound pass, only the count's lower
half go unchecked, which ``proved`` then refuses. A failed certificate proves nothing; it is
reported as such.

QK-norm with eps > 0: N_eps(z) = N_1(z / sqrt(eps)), so the layer with eps and the layer with
eps = 1 are the same function after a linear change of the query/key projections; their
Jacobians have the same rank at corresponding points, and certifying eps = 1 covers every
eps > 0 (``certify`` refuses other positive values rather than certify them ill-conditioned).

Covered: ``AttentionSpec`` layouts (any heads and groups, biases, RoPE, QK-norm of every kind,
softmax, sink or sigmoid, causal mask, window, chunks) and ``MLASpec`` (latent attention, with or
without a query latent, with eps = 0 or 1 in its latent norms). The ball layers written here
follow ``attnid.layer`` and ``attnid.families.mla``; ``forward_error`` and its tests compare them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from flint import arb, arb_mat, ctx

from attnid import families
from attnid.jacobian import input_jacobian, unflatten
from attnid.families.mla import MLASpec
from attnid.spec import AttentionSpec

PRECISION_BITS = 128  # arb's working precision; balls of about 1e-38 relative width around float64 data
Mat = list[list[arb]]  # a matrix as rows of balls, for the elementwise steps


@dataclass(frozen=True)
class BallCertificate:
    """The outcome of one ball-arithmetic rank proof."""

    spec: AttentionSpec | MLASpec
    total: int  # P
    claimed: int  # u: the count whose upper bound is to be proved
    rank_proved: bool  # rank J >= P - u proved (the Gram determinant's ball excludes 0)
    orbit: int  # dimension of the span of attnid.symmetry's generators at the point (a float64 rank decision)
    n_inputs: int
    seq_len: int
    rows: int  # rows of J used
    log10_det_low: float | None  # log10 of the proved lower bound on det of the Gram matrix (None: not proved)
    seconds: float
    precision_bits: int

    @property
    def proved(self) -> bool:
        """Whether the count u is established: rank J >= P - u by the balls, and as many symmetry directions.

        The symmetries' invariance and their number at a generic point are the hand-proved part
        of the book's theorems; ``orbit`` checks that the generators here are that many.
        """
        return self.rank_proved and self.orbit >= self.claimed

    @property
    def rank_lower_bound(self) -> int | None:
        """The proved lower bound on rank J (None when nothing was proved)."""
        return self.total - self.claimed if self.rank_proved else None


def _ball(t: torch.Tensor) -> arb_mat:
    """A 2-D float64 tensor (a 1-D one as a row) as an exact arb_mat: each float64 is a dyadic rational."""
    t = t.detach().to(torch.float64).cpu()
    if t.ndim == 1:
        t = t[None, :]
    return arb_mat(t.shape[0], t.shape[1], [arb(float(v)) for v in t.reshape(-1).tolist()])


def _rows(m: arb_mat) -> Mat:
    return [[m[i, j] for j in range(m.ncols())] for i in range(m.nrows())]


def _mat(rows: Mat) -> arb_mat:
    return arb_mat(len(rows), len(rows[0]), [v for row in rows for v in row])


def _add_row(m: arb_mat, row: arb_mat) -> arb_mat:
    """m + 1 row: a bias row added to every row of m."""
    return m + arb_mat(m.nrows(), 1, [arb(1)] * m.nrows()) * row


def _hidden(spec: AttentionSpec, i: int, j: int) -> bool:
    """Whether row i may not see key j (``attnid.normalise``'s masks)."""
    if not spec.causal:
        return False
    if j > i:
        return True
    if spec.window is not None:
        return i - j >= spec.window
    if spec.chunk is not None:
        return j // spec.chunk != i // spec.chunk
    return False


def _rope_angles(base: float, rope_dims: int, n: int) -> list[list[tuple[arb, arb]]]:
    """(cos, sin) of p * base^(-2i/r) for each position p and pair i, in ball arithmetic."""
    half = rope_dims // 2
    freqs = [arb(base) ** (arb(-2 * i) / rope_dims) for i in range(half)]
    return [[((p * f).cos(), (p * f).sin()) for f in freqs] for p in range(n)]


def _rope(rows: Mat, angles: list[list[tuple[arb, arb]]], rope_dims: int) -> Mat:
    """Rotate pair (i, i + r/2) of row p by its angle (the rotate-half layout of ``attnid.rope``); linear."""
    half = rope_dims // 2
    out = []
    for p, row in enumerate(rows):
        new = list(row)
        for i in range(half):
            c, s = angles[p][i]
            new[i] = row[i] * c - row[i + half] * s
            new[i + half] = row[i + half] * c + row[i] * s
        out.append(new)
    return out


def _rms(z: list[Mat], dz: list[Mat], weight: Mat | None, dweight: Mat | None, eps: float,
         full: bool = False) -> tuple[list[Mat], list[Mat]]:
    """RMSNorm of each matrix's rows (over all matrices' entries of a row with ``full``) times a weight; and its tangent.

    ``weight`` is None (no weight), one row for all matrices, or one row per matrix: the QK-norms of
    ``attnid.layer`` ('unweighted', 'shared', 'per-head' and 'full') and the latent norms of MLA.
    """
    heads, n, width = len(z), len(z[0]), len(z[0][0])
    eps_ball = arb(eps)
    out = [[[arb(0)] * width for _ in range(n)] for _ in range(heads)]
    dout = [[[arb(0)] * width for _ in range(n)] for _ in range(heads)]
    for members in ([list(range(heads))] if full else [[h] for h in range(heads)]):
        size = len(members) * width
        for p in range(n):
            ms = sum((z[h][p][c] ** 2 for h in members for c in range(width)), arb(0)) / size + eps_ball
            dms = 2 * sum((z[h][p][c] * dz[h][p][c] for h in members for c in range(width)), arb(0)) / size
            r = ms.rsqrt()
            dr = -r ** 3 * dms / 2
            for h in members:
                for c in range(width):
                    w = arb(1) if weight is None else weight[0 if len(weight) == 1 else h][c]
                    dw = arb(0) if dweight is None else dweight[0 if len(dweight) == 1 else h][c]
                    out[h][p][c] = z[h][p][c] * r * w
                    dout[h][p][c] = (dz[h][p][c] * r + z[h][p][c] * dr) * w + z[h][p][c] * r * dw
    return out, dout


def _weights(s: Mat, ds: Mat, spec: AttentionSpec, sink: arb | None, dsink: arb) -> tuple[Mat, Mat]:
    """Attention weights of one head from its scores, and their tangent (softmax, sink or sigmoid)."""
    n = len(s)
    a = [[arb(0)] * n for _ in range(n)]
    da = [[arb(0)] * n for _ in range(n)]
    for i in range(n):
        seen = [j for j in range(n) if not _hidden(spec, i, j)]
        if spec.norm == "sigmoid":
            for j in seen:
                a[i][j] = 1 / (1 + (-s[i][j]).exp())
                da[i][j] = a[i][j] * (1 - a[i][j]) * ds[i][j]
            continue
        e = {j: s[i][j].exp() for j in seen}
        extra = (sink.exp() if sink is not None else arb(1)) if spec.norm == "sink" else arb(0)
        total = sum(e.values(), arb(0)) + extra
        for j in seen:
            a[i][j] = e[j] / total
        mean = sum((a[i][j] * ds[i][j] for j in seen), arb(0)) + (extra / total) * dsink
        for j in seen:
            da[i][j] = a[i][j] * (ds[i][j] - mean)
    return a, da


def _split(m: arb_mat, heads: int, width: int) -> list[Mat]:
    """(n, heads * width) -> per head (n, width) rows."""
    rows = _rows(m)
    return [[row[h * width:(h + 1) * width] for row in rows] for h in range(heads)]


def _project(x: arb_mat, w: list[arb_mat], b: list[arb_mat] | None) -> list[arb_mat]:
    return [x * w[h] if b is None else _add_row(x * w[h], b[h]) for h in range(len(w))]


def _per_head(t: torch.Tensor | None) -> list[arb_mat] | None:
    return None if t is None else [_ball(t[h]) for h in range(t.shape[0])]


def _norm_rows(t: torch.Tensor | None) -> list[list[arb]] | None:
    if t is None:
        return None
    rows = t[None] if t.ndim == 1 else t
    return [[arb(float(v)) for v in row.tolist()] for row in rows]


def layer_jvp(params: dict[str, torch.Tensor], tangent: dict[str, torch.Tensor], x: torch.Tensor,
              spec: AttentionSpec) -> tuple[arb_mat, arb_mat]:
    """(Y, dY) of ``attnid.layer.forward`` at exact float64 ``params`` and input ``x`` (n, d), in ball arithmetic."""
    h, dk, n = spec.heads, spec.head_dim, x.shape[0]
    xb = _ball(x)
    proj = {}
    for name, bias in (("Q", "b_Q"), ("K", "b_K"), ("V", "b_V")):
        w, dw = _per_head(params[f"W_{name}"]), _per_head(tangent[f"W_{name}"])
        b, db = _per_head(params.get(bias)), _per_head(tangent.get(bias))
        proj[name] = ([_rows(m) for m in _project(xb, w, b)], [_rows(m) for m in _project(xb, dw, db)])
    (q, dq), (k, dk_), (v, dvv) = proj["Q"], proj["K"], proj["V"]
    if spec.has_qk_norm:
        full, eps = spec.qk_norm == "full", spec.qk_norm_eps
        q, dq = _rms(q, dq, _norm_rows(params.get("q_norm")), _norm_rows(tangent.get("q_norm")), eps, full)
        k, dk_ = _rms(k, dk_, _norm_rows(params.get("k_norm")), _norm_rows(tangent.get("k_norm")), eps, full)
    if spec.rope_dims:
        angles = _rope_angles(spec.rope_base, spec.rope_dims, n)
        q, dq = ([_rope(m, angles, spec.rope_dims) for m in t] for t in (q, dq))
        k, dk_ = ([_rope(m, angles, spec.rope_dims) for m in t] for t in (k, dk_))
    root = arb(dk).sqrt()
    sink = params.get("sink")
    dsink = tangent.get("sink")
    y = arb_mat(n, spec.d_model)
    dy = arb_mat(n, spec.d_model)
    for head in range(h):
        grp = spec.group_of_head(head)
        qm, dqm, km, dkm = _mat(q[head]), _mat(dq[head]), _mat(k[grp]), _mat(dk_[grp])
        s = _rows(qm * km.transpose() / root)
        ds = _rows((dqm * km.transpose() + qm * dkm.transpose()) / root)
        a, da = _weights(s, ds, spec, None if sink is None else arb(float(sink[head])),
                         arb(0) if dsink is None else arb(float(dsink[head])))
        am, dam, vm, dvm = _mat(a), _mat(da), _mat(v[grp]), _mat(dvv[grp])
        o, do = am * vm, dam * vm + am * dvm
        wo, dwo = _ball(params["W_O"][head]), _ball(tangent["W_O"][head])
        y += o * wo
        dy += do * wo + o * dwo
    if "b_O" in params:
        y, dy = _add_row(y, _ball(params["b_O"])), _add_row(dy, _ball(tangent["b_O"]))
    return y, dy


def mla_jvp(params: dict[str, torch.Tensor], tangent: dict[str, torch.Tensor], x: torch.Tensor,
            spec: MLASpec) -> tuple[arb_mat, arb_mat]:
    """(Y, dY) of ``attnid.families.mla.forward`` at exact float64 ``params`` and input ``x`` (n, d), in ball arithmetic."""
    dn, dr, n = spec.qk_nope_head_dim, spec.qk_rope_head_dim, x.shape[0]
    xb = _ball(x)

    def latent(down: str, gain: str) -> tuple[Mat, Mat]:
        z, dz = _rows(xb * _ball(params[down])), _rows(xb * _ball(tangent[down]))
        (out,), (dout,) = _rms([z], [dz], _norm_rows(params[gain]), _norm_rows(tangent[gain]), spec.norm_eps)
        return out, dout

    if spec.q_lora_rank is None:
        source, dsource, up = xb, arb_mat(n, spec.d_model), "W_Q"
    else:
        lq, dlq = latent("W_DQ", "g_Q")
        source, dsource, up = _mat(lq), _mat(dlq), "W_UQ"
    c, dc = (_mat(m) for m in latent("W_DKV", "g_KV"))
    angles = _rope_angles(spec.rope_base, dr, n) if dr else []
    if dr:
        kr, dkr = (_mat(_rope(_rows(xb * _ball(t["W_KR"])), angles, dr)) for t in (params, tangent))
    root = arb(spec.qk_head_dim).sqrt()
    mask = AttentionSpec.create(1, 1, causal=spec.causal)  # plain softmax with the layout's causal mask
    y, dy = arb_mat(n, spec.d_model), arb_mat(n, spec.d_model)
    for head in range(spec.heads):
        w, dw = _ball(params[up][head]), _ball(tangent[up][head])
        q, dq = _rows(source * w), _rows(dsource * w + source * dw)
        qn, dqn = _mat([r[:dn] for r in q]), _mat([r[:dn] for r in dq])
        uk, duk = _ball(params["W_UK"][head]), _ball(tangent["W_UK"][head])
        kn, dkn = c * uk, dc * uk + c * duk
        s, ds = qn * kn.transpose(), dqn * kn.transpose() + qn * dkn.transpose()
        if dr:
            qr, dqr = (_mat(_rope([r[dn:] for r in m], angles, dr)) for m in (q, dq))
            s, ds = s + qr * kr.transpose(), ds + dqr * kr.transpose() + qr * dkr.transpose()
        a, da = _weights(_rows(s / root), _rows(ds / root), mask, None, arb(0))
        uv, duv = _ball(params["W_UV"][head]), _ball(tangent["W_UV"][head])
        v, dv = c * uv, dc * uv + c * duv
        am, dam = _mat(a), _mat(da)
        o, do = am * v, dam * v + am * dv
        wo, dwo = _ball(params["W_O"][head]), _ball(tangent["W_O"][head])
        y += o * wo
        dy += do * wo + o * dwo
    return y, dy


def _complement(tangent: torch.Tensor, claimed: int) -> torch.Tensor:
    """(P, P - u): float64 columns spanning the complement of the orbit's tangent (its last left singular vectors)."""
    p = tangent.shape[0]
    if tangent.shape[1] < claimed:
        # fewer symmetry directions than the claim: complete with any directions; the proof then fails or not
        extra = torch.randn(p, claimed - tangent.shape[1], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        tangent = torch.cat([tangent, extra], dim=1)
    u, _, _ = torch.linalg.svd(tangent[:, :claimed], full_matrices=True)
    return u[:, claimed:]


def _check(spec: AttentionSpec | MLASpec) -> None:
    if not isinstance(spec, (AttentionSpec, MLASpec)):
        raise TypeError(f"ballcert certifies AttentionSpec and MLASpec layouts, got {type(spec).__name__}")
    eps = spec.norm_eps if isinstance(spec, MLASpec) else spec.qk_norm_eps if spec.has_qk_norm else 0.0
    if eps not in (0.0, 1.0):
        raise ValueError(f"certify a layout with a norm at eps = 0 or eps = 1 (eps = 1 covers every eps > 0 by the "
                         f"rescaling N_eps(z) = N_1(z / sqrt(eps))), got eps = {eps:g}")


def _jvp(spec: AttentionSpec | MLASpec):  # noqa: ANN202 - one of the two ball layers
    return mla_jvp if isinstance(spec, MLASpec) else layer_jvp


def certify(spec: AttentionSpec | MLASpec, *, claimed: int | None = None, seed: int = 0, seq_len: int = 6,
            n_inputs: int | None = None, precision_bits: int = PRECISION_BITS,
            drop_orbit_directions: int = 0) -> BallCertificate:
    """Prove rank J >= P - claimed (default: the exact count) at a seeded float64 point, in ball arithmetic.

    ``n_inputs`` defaults to the fewest inputs on which a float64 preview of J B has full rank, plus one.
    ``drop_orbit_directions`` removes that many of the orbit's tangent directions before the
    complement is taken (a test that a missing symmetry generator makes the proof fail).
    """
    _check(spec)
    start = time.perf_counter()
    exact = families.count(spec)
    claimed = exact.unidentified if claimed is None else claimed
    if claimed is None:
        raise ValueError(f"no exact count to certify for this layout ({exact.note}); give claimed=")
    gen = torch.Generator().manual_seed(seed)
    params = families.init_params(spec, gen)
    orbit = families.tangent_basis(params, spec)
    orbit = orbit[:, :orbit.shape[1] - drop_orbit_directions]
    directions = _complement(orbit, claimed)
    width = directions.shape[1]
    inputs = _inputs(spec, params, directions, seq_len, gen, n_inputs)
    old = ctx.prec
    ctx.prec = precision_bits
    try:
        columns = []
        for col in range(width):
            direction = unflatten(directions[:, col].contiguous(), params)
            parts = [_jvp(spec)(params, direction, x, spec)[1] for x in inputs]
            columns.append([e for part in parts for row in _rows(part) for e in row])
        rows = len(columns[0])
        m = arb_mat(rows, width, [columns[c][r] for r in range(rows) for c in range(width)])
        det = (m.transpose() * m).det() if width else arb(1)
        proved = not det.contains(0)
        low = float((det.abs_lower()).log() / arb(10).log()) if proved and width else (0.0 if proved else None)
    finally:
        ctx.prec = old
    return BallCertificate(spec, exact.total, claimed, proved, orbit.shape[1], len(inputs),
                           seq_len, rows if width else 0, low, time.perf_counter() - start, precision_bits)


MAX_INPUTS = 64
FLOAT_RANK_TOL = 1e-9  # relative singular value below which the float64 preview counts a direction as unseen


def _inputs(spec: AttentionSpec | MLASpec, params: dict[str, torch.Tensor], directions: torch.Tensor, seq_len: int,
            gen: torch.Generator, n_inputs: int | None) -> list[torch.Tensor]:
    """``n_inputs`` Gaussian inputs, or (None) the fewest whose float64 J B has full column rank, plus one.

    The float64 preview only chooses how many inputs to evaluate in balls; the proof does not rest on it.
    """
    def draw() -> torch.Tensor:
        return torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64)

    if n_inputs is not None:
        return [draw() for _ in range(n_inputs)]
    width, inputs, blocks = directions.shape[1], [], []
    while len(inputs) < MAX_INPUTS:
        inputs.append(draw())
        blocks.append(input_jacobian(lambda p, x: families.forward(p, x, spec), params, inputs[-1]) @ directions)
        s = torch.linalg.svdvals(torch.cat(blocks)) if width else torch.ones(1)
        if len(s) >= width and (width == 0 or float(s[width - 1] / s[0]) > FLOAT_RANK_TOL):
            return inputs + [draw()]
    return inputs


def forward_error(spec: AttentionSpec | MLASpec, seed: int = 0, seq_len: int = 5) -> float:
    """Largest difference between this module's (Y, dY) midpoints and ``attnid.layer``'s float64 forward and JVP.

    A check that the ball layer is the layer (relative to the outputs' size); about 1e-15 when it is.
    """
    _check(spec)
    gen = torch.Generator().manual_seed(seed)
    params = families.init_params(spec, gen)
    tangent = {k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in params.items()}
    x = torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64)
    y, dy = _jvp(spec)(params, tangent, x, spec)
    ref_y, ref_dy = torch.func.jvp(lambda p: families.forward(p, x, spec), (params,), (tangent,))

    def mids(m: arb_mat) -> torch.Tensor:
        return torch.tensor([[float(m[i, j].mid()) for j in range(m.ncols())] for i in range(m.nrows())],
                            dtype=torch.float64)

    return max(float((mids(y) - ref_y).abs().max() / ref_y.abs().max()),
               float((mids(dy) - ref_dy).abs().max() / ref_dy.abs().max()))


