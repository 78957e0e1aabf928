"""Two warm-up models for chapter 1 whose identification is known in closed form.

* ``product``: f(x; a, b) = a * b * x. Two parameters, one symmetry (a, b) -> (t a, b / t).
* ``factored_linear``: f(X; A, B) = X A B with A of shape (d_in, k) and B of shape
  (k, d_out): a linear map written as a product, the structure of an attention head's
  W_V W_O (and, with a transpose, of W_Q W_K^T). Symmetry: (A, B) -> (A M, M^{-1} B),
  M in GL(k).
"""

from __future__ import annotations

import torch

from attnid.counts import FactoredCount
from attnid.spec import Params

__all__ = ["FactoredCount", "factored_linear", "product", "random_factored_params", "random_inputs"]


def product(params: Params, x: torch.Tensor) -> torch.Tensor:
    """f(x; a, b) = a b x."""
    return params["a"] * params["b"] * x


def factored_linear(params: Params, x: torch.Tensor) -> torch.Tensor:
    """f(X; A, B) = X A B for X of shape (n, d_in)."""
    return x @ params["A"] @ params["B"]


def random_factored_params(
    count: FactoredCount, generator: torch.Generator, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """A generic point: Gaussian A and B, scaled so that X A B stays of order one."""
    a = torch.randn(count.d_in, count.k, generator=generator, dtype=dtype) / count.d_in**0.5
    b = torch.randn(count.k, count.d_out, generator=generator, dtype=dtype) / count.k**0.5
    return {"A": a.to(device), "B": b.to(device)}


def random_inputs(
    n_inputs: int, n_tokens: int, width: int, generator: torch.Generator, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """n_inputs independent Gaussian inputs of shape (n_tokens, width)."""
    if n_inputs < 1 or n_tokens < 1 or width < 1:
        raise ValueError(f"n_inputs, n_tokens and width must be >= 1, got {n_inputs}, {n_tokens}, {width}")
    return [torch.randn(n_tokens, width, generator=generator, dtype=dtype).to(device) for _ in range(n_inputs)]
