"""The numeric check: the closed-form count next to the Jacobian's nullity at a random point."""

from __future__ import annotations

import torch

from attnid.jacobian import count_parameters, flatten
from attnid.nullity import FamilyCheck, check_int, measure
from attnid.spec import Params
from attnid.families.mla.count import count
from attnid.families.mla.layer import forward, init_params
from attnid.families.mla.spec import MLASpec
from attnid.families.mla.symmetry import scale_direction, tangent_basis

MLAVerification = FamilyCheck  # the record of ``attnid.nullity``: count, decision, orbit, weak directions


def verify(spec: MLASpec, *, seed: int = 0, seq_len: int = 6, n_inputs: int | None = None,
           max_rounds: int = 4) -> FamilyCheck:
    """Numeric nullity of the float64 Jacobian at a random point, by the library's rank rule (``attnid.nullity``).

    ``weak`` measures the scale direction of each down-projection, which the latent RMSNorm sees
    only through its eps.
    """
    check_int("seq_len", seq_len, 2)
    gen = torch.Generator().manual_seed(seed)
    params = init_params(spec, gen)

    def fn(p: Params, x: torch.Tensor) -> torch.Tensor:
        return forward(p, x, spec)

    measured = measure(fn, params, spec.d_model, gen, seq_len=seq_len, n_inputs=n_inputs, max_rounds=max_rounds)
    orbit, orbit_stretch = measured.orbit(tangent_basis(params, spec).T)
    weak = {f"W_D{'KV' if w == 'kv' else 'Q'} scale": measured.stretch(flatten(scale_direction(params, spec, w)))
            for w in (("kv", "q") if spec.q_lora_rank is not None else ("kv",))}
    return FamilyCheck(spec, count_parameters(params), count(spec).unidentified, measured.decision, orbit,
                       orbit_stretch, measured.n_inputs, seq_len, weak)
