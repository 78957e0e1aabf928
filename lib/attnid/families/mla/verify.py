"""The numeric check: the closed-form count next to the Jacobian's nullity at a random point."""

from __future__ import annotations

from attnid.jacobian import flatten
from attnid.budget import Estimate
from attnid.nullity import FamilyCheck, Measured, check_layout, checked_estimate
from attnid.spec import Params
from attnid.families.mla.count import count
from attnid.families.mla.layer import forward, init_params
from attnid.families.mla.spec import MLASpec
from attnid.families.mla.symmetry import scale_direction, tangent_basis

MLAVerification = FamilyCheck  # the record of ``attnid.nullity``: count, decision, orbit, weak directions


CHECK_SEQ_LEN = 6  # tokens per input of the latent family's check


def default_seq_len(spec: MLASpec) -> int:
    """The tokens per input of ``verify``."""
    return CHECK_SEQ_LEN


def estimate(spec: MLASpec, seq_len: int | None = None, n_inputs: int | None = None, method: str = "auto") -> Estimate:
    """The peak-memory estimate of ``verify`` with the same arguments (``attnid.nullity.checked_estimate``)."""
    return checked_estimate(count(spec).total, spec.d_model, CHECK_SEQ_LEN if seq_len is None else seq_len, n_inputs,
                            method)


def _scale_stretches(params: Params, measured: Measured, spec: MLASpec) -> dict[str, float]:
    """How strongly the Jacobian sees the scale direction of each down-projection (its RMSNorm's eps only)."""
    return {f"W_D{'KV' if w == 'kv' else 'Q'} scale": measured.stretch(flatten(scale_direction(params, spec, w)))
            for w in (("kv", "q") if spec.q_lora_rank is not None else ("kv",))}


def verify(spec: MLASpec, *, seed: int = 0, seq_len: int | None = None, n_inputs: int | None = None,
           max_rounds: int = 4, method: str = "auto", progress: bool = False,
           max_bytes: int | None = None) -> FamilyCheck:
    """Numeric nullity of the float64 Jacobian at a random point, by the library's rank rule (``attnid.nullity``).

    ``weak`` measures the scale direction of each down-projection, which the latent RMSNorm sees
    only through its eps. ``method``, ``progress`` and ``max_bytes`` as in ``attnid.verify``.
    """
    exact = count(spec)
    return check_layout(spec, init_params=init_params, forward=forward,
                        tangent_basis=lambda params, s: tangent_basis(params, s).T, exact=exact.unidentified,
                        total=exact.total, seq_len=CHECK_SEQ_LEN if seq_len is None else seq_len, seed=seed,
                        n_inputs=n_inputs, max_rounds=max_rounds, method=method, progress=progress,
                        max_bytes=max_bytes, weak=lambda params, measured: _scale_stretches(params, measured, spec))
