"""Run a command in the perturbed numeric environment of ``attnbook.machine`` (what ``make test`` runs nbval in).

    python scripts/perturbed.py [--show] -- COMMAND [ARGS...]

One thread for OpenMP, MKL and OpenBLAS, MKL's compatible code path (MKL_CBWR), PyTorch's generic
kernels (ATEN_CPU_CAPABILITY=default) and NumPy's own SIMD loops switched off
(NPY_DISABLE_CPU_FEATURES): the stored outputs were written in the
machine's default environment, so an output that depends on summation order or on the CPU's
kernels fails here as it would on another machine. OPENBLAS_CORETYPE is never touched.
"""

from __future__ import annotations

import argparse
import os
import sys

from attnbook.machine import portable_environment


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the variables set before running")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")
    changes = portable_environment()
    if args.show:
        print("perturbed numeric environment: " + ", ".join(f"{k}={v}" for k, v in sorted(changes.items())),
              flush=True)
    os.execvpe(command[0], command, {**os.environ, **changes})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
