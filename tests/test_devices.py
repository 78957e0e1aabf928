"""Device (the book's DEVICE parameter) and seed handling."""

import pytest
import torch

import attnid
from attnbook.devices import describe_device, resolve_device


def test_cpu_and_auto_resolve() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert describe_device(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("name", ["gpu", "CUDA", "", "tpu"])
def test_unknown_device_names_the_valid_ones(name: str) -> None:
    with pytest.raises(ValueError, match="DEVICE must be one of cpu, cuda, auto"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")


def test_generator_is_reproducible_and_validated() -> None:
    a = torch.randn(3, generator=attnid.generator(7))
    b = torch.randn(3, generator=attnid.generator(7))
    assert torch.equal(a, b)
    for bad in (-1, 1.5, "3"):
        with pytest.raises(ValueError, match="non-negative integer"):
            attnid.generator(bad)  # type: ignore[arg-type]
