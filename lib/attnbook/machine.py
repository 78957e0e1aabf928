"""The numeric environment a run happens in: a fingerprint for per-machine data, and a perturbed environment.

Floating-point results below rounding level depend on the CPU (which SIMD kernels NumPy,
OpenBLAS and MKL pick), the thread count and the BLAS build. ``fingerprint()`` names that
environment for the data that genuinely depend on it (``data/**/machines/<fingerprint>/``,
rule 4 of ``attnbook.precision``); ``perturbed_environment()`` is what ``make test`` runs the
notebooks under, so that a stored output that would change on another CPU fails here too.
"""

from __future__ import annotations

import os
import platform
import re

# The machine that wrote the book: its per-machine measurements are the ones committed and shown
# (.gitignore keeps this folder and ignores every other machines/<fingerprint>/).
REFERENCE = "x86_64-amd-epyc-x86_v3-t2"
PER_MACHINE = "machines"  # data/**/machines/<fingerprint>/: measurements that depend on the machine

# What the perturbed run changes; OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are left as the machine set them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
MKL_PATH = "COMPATIBLE"  # MKL_CBWR: MKL's conditional-numerical-reproducibility code path


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.split(":")[0].strip() in ("model name", "Model", "Hardware"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def numpy_simd() -> list[str]:
    """The SIMD targets NumPy dispatches to on this CPU now (after NPY_DISABLE_CPU_FEATURES)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__  # noqa: PLC0415

    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def threads() -> int:
    """PyTorch's intra-op thread count."""
    import torch  # noqa: PLC0415

    return torch.get_num_threads()


def description() -> dict[str, str]:
    """What the fingerprint is made of, for a reader."""
    return {
        "arch": platform.machine(),
        "cpu": cpu_model(),
        "numpy_simd": " ".join(numpy_simd()) or "baseline",
        "threads": str(threads()),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
    }


def fingerprint() -> str:
    """A folder name for this numeric environment, e.g. ``x86_64-amd-epyc-x86_v3-t2``."""
    info = description()
    simd = info["numpy_simd"].split()[-1]
    parts = [info["arch"], info["cpu"], simd, f"t{info['threads']}", info["mkl_cbwr"], info["openblas_coretype"]]
    slug = "-".join(p for p in parts if p)
    return re.sub(r"[^a-z0-9_]+", "-", slug.lower()).strip("-")[:80]


def is_other_machine(relative: str) -> bool:
    """Whether a data path (relative to data/) lies in another machine's per-machine folder than REFERENCE's."""
    parts = relative.split("/")
    return any(a == PER_MACHINE and b != REFERENCE for a, b in zip(parts, parts[1:-1]))


def perturbed_environment() -> dict[str, str]:
    """Environment variables that change the numeric environment without touching OpenBLAS's core type:
    one thread everywhere, MKL's compatible code path, and NumPy's own SIMD kernels switched off."""
    env = dict.fromkeys(THREAD_VARIABLES, "1")
    env["MKL_CBWR"] = MKL_PATH
    simd = numpy_simd()
    if simd:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(simd)
    return env
