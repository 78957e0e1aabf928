"""The numeric environment a run happens in: a fingerprint for per-machine data, and a portable environment.

Floating-point results below rounding level depend on the CPU (which SIMD kernels NumPy,
OpenBLAS, MKL and PyTorch's ATen pick), the thread count and the BLAS build.
``fingerprint()`` names that environment for the data that genuinely depend on it
(``data/**/machines/<fingerprint>/``, rule 4 of ``attnbook.precision``);
``portable_environment()`` pins the numerics to code paths every x86-64 CPU runs the same way,
and it has two uses:

* the experiments (``experiments/*.ipynb``) run in it under ``make reproduce``: their float32
  training runs amplify a last-bit difference of one matrix product into a different trajectory,
  so their data are byte-identical on another x86-64 CPU only when every kernel is the same
  there. Each pin matters (``tests/test_precision.py``: MKL's default path, PyTorch's AVX2
  kernels and two threads each change a float32 training step's bytes), and MKL promises its
  compatible path gives the same bits on every x86-64 processor at a fixed thread count;
* ``make test`` re-executes the chapters in it (``scripts/perturbed.py``): the chapters are
  written in the machine's default environment, so a stored output that depends on summation
  order or on the CPU's kernels fails there as it would on another machine.

What it can and cannot change: it switches PyTorch to its generic (non-SIMD)
ATen kernels, MKL to its compatible code path, every library to one thread, and NumPy's own
SIMD loops off. It leaves OpenBLAS's choice of kernel alone: that is ``OPENBLAS_CORETYPE``,
which some machines set on purpose and which the book never touches, so NumPy's BLAS and
LAPACK results are guarded by the precision rule alone (the experiments use no NumPy linear
algebra). MKL's compatible path is an x86 promise: on ARM, where PyTorch uses other BLAS builds,
nothing here makes the experiments' bytes portable.
"""

from __future__ import annotations

import os
import platform
import re

# The machine that last wrote the book's per-machine measurements: they are the ones committed and shown
# (.gitignore keeps this folder and ignores every other machines/<fingerprint>/). A session on another
# machine moves it (and re-runs the pages that show them), since it cannot refresh the old folder.
REFERENCE = "x86_64-intel-r-xeon-r-processor-2-80ghz-f6m106-avx512_icl-avx512-skylakex-t2"
PER_MACHINE = "machines"  # data/**/machines/<fingerprint>/: measurements that depend on the machine

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
MKL_PATH = "COMPATIBLE"  # MKL_CBWR: MKL's conditional-numerical-reproducibility code path
ATEN_GENERIC = "default"  # ATEN_CPU_CAPABILITY: PyTorch's kernels without AVX2/AVX-512/SVE
# /proc/cpuinfo fields that tell processors apart: x86 (model name, family, model) and ARM (implementer, part)
CPUINFO_FIELDS = {"model name": "", "cpu family": "f", "model": "m", "CPU implementer": "i", "CPU part": "p"}


def cpuinfo() -> dict[str, str]:
    """The first processor's identifying fields of /proc/cpuinfo (empty where there is none)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in CPUINFO_FIELDS and key not in found:
                    found[key] = value.strip()
    except OSError:
        pass
    return found


def cpu_model() -> str:
    """The CPU's name with the family/model (x86) or implementer/part (ARM) numbers that tell generations apart."""
    info = cpuinfo()
    name = info.get("model name") or platform.processor() or "unknown"
    numbers = "".join(CPUINFO_FIELDS[k] + info[k] for k in CPUINFO_FIELDS if CPUINFO_FIELDS[k] and k in info)
    return f"{name} {numbers}".strip()


def numpy_simd() -> list[str]:
    """The SIMD targets NumPy dispatches to on this CPU now (after NPY_DISABLE_CPU_FEATURES)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__  # noqa: PLC0415
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__  # noqa: PLC0415
    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def blas_cores() -> list[str]:
    """The kernel family each loaded BLAS chose (OpenBLAS's core type, e.g. 'Haswell'), after importing torch."""
    import torch  # noqa: F401, PLC0415 (its BLAS and OpenMP, loaded)
    from threadpoolctl import threadpool_info  # noqa: PLC0415

    return sorted({str(i.get("architecture")) for i in threadpool_info() if i.get("architecture")})


def torch_capability() -> str:
    """The vector instruction set PyTorch's ATen kernels use ('AVX2', 'AVX512', 'DEFAULT', ...)."""
    import torch  # noqa: PLC0415

    return torch.backends.cpu.get_cpu_capability()


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
        "torch_capability": torch_capability(),
        "blas_core": " ".join(blas_cores()),
        "threads": str(threads()),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
    }


def fingerprint() -> str:
    """A folder name for this numeric environment, e.g. ``x86_64-amd-epyc-f25m1-x86_v3-avx2-haswell-t2``."""
    info = description()
    parts = [info["arch"], info["cpu"], info["numpy_simd"].split()[-1], info["torch_capability"],
             info["blas_core"], f"t{info['threads']}", info["mkl_cbwr"]]
    slug = "-".join(p for p in parts if p)
    return re.sub(r"[^a-z0-9_]+", "-", slug.lower()).strip("-")[:100]


def is_other_machine(relative: str) -> bool:
    """Whether a data path lies in another machine's per-machine folder than REFERENCE's."""
    parts = relative.split("/")
    return any(a == PER_MACHINE and b != REFERENCE for a, b in zip(parts, parts[1:-1]))


def portable_environment() -> dict[str, str]:
    """Environment variables that pin the numerics without touching OpenBLAS's core type: one thread
    everywhere, MKL's compatible code path, PyTorch's generic kernels, NumPy's dispatched SIMD loops off."""
    env = dict.fromkeys(THREAD_VARIABLES, "1")
    env["MKL_CBWR"] = MKL_PATH
    env["ATEN_CPU_CAPABILITY"] = ATEN_GENERIC
    simd = numpy_simd()
    if simd:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(simd)
    return env
