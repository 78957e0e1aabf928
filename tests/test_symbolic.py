"""Exact-arithmetic nullity at integer points, and every chapter's SymPy check (attnid.symbolic's topic modules)."""

import importlib
import inspect
import pkgutil
from collections.abc import Callable

import pytest
import sympy as sp

import attnid.symbolic
from attnid import toy
from attnid.symbolic import Identity, exact_nullity, failed, matrix_symbols


def test_product_has_nullity_one() -> None:
    a, b = sp.symbols("a b")
    assert exact_nullity([a * b], [a, b], seed=1) == 1


def test_independent_outputs_have_nullity_zero() -> None:
    a, b = sp.symbols("a b")
    assert exact_nullity([a + b, a - 2 * b], [a, b], seed=1) == 0


@pytest.mark.parametrize("shape", [(2, 1, 3), (3, 2, 3), (2, 3, 2), (3, 4, 2)])
def test_factored_product_matches_the_formula(shape: tuple[int, int, int]) -> None:
    a = matrix_symbols("A", shape[0], shape[1])
    b = matrix_symbols("B", shape[1], shape[2])
    assert exact_nullity(list(a * b), list(a) + list(b), seed=3) == toy.FactoredCount(*shape).unidentified


def test_bad_arguments_are_rejected() -> None:
    a = sp.Symbol("a")
    with pytest.raises(ValueError, match="variables is empty"):
        exact_nullity([a], [], seed=0)
    with pytest.raises(ValueError, match="outputs is empty"):
        exact_nullity([], [a], seed=0)
    with pytest.raises(ValueError, match="bound must be"):
        exact_nullity([a], [a], seed=0, bound=0)
    with pytest.raises(ValueError, match="matrix shape must be positive"):
        matrix_symbols("M", 0, 2)


def _chapter_checks() -> list[tuple[str, Callable[[], list[Identity]]]]:
    """Every public function of an attnid.symbolic topic module that returns list[Identity] with no argument."""
    found = []
    for info in pkgutil.iter_modules(attnid.symbolic.__path__):
        module = importlib.import_module(f"attnid.symbolic.{info.name}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            signature = inspect.signature(function)
            no_argument = all(p.default is not p.empty for p in signature.parameters.values())
            if (function.__module__ == module.__name__ and not name.startswith("_") and no_argument
                    and signature.return_annotation in ("list[Identity]", list[Identity])):
                found.append((f"{info.name}.{name}", function))
    return found


CHAPTER_CHECKS = _chapter_checks()


def test_the_chapter_checks_are_found() -> None:
    # one module per topic and at least one check each: a discovery that finds nothing would pass vacuously
    modules = {name.split(".")[0] for name, _ in CHAPTER_CHECKS}
    assert {"identification", "heads", "layouts", "biases", "norms", "latent", "modern", "training", "kernels",
            "width_one"} <= modules
    assert len(CHAPTER_CHECKS) >= 30


@pytest.mark.parametrize("check", [f for _, f in CHAPTER_CHECKS], ids=[n for n, _ in CHAPTER_CHECKS])
def test_every_chapter_identity_holds(check: Callable[[], list[Identity]]) -> None:
    checks = check()
    assert checks and all(isinstance(c, Identity) and c.statement and c.result for c in checks)
    assert not failed(checks), failed(checks)
