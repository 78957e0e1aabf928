#!/usr/bin/env python3
"""Compile the Triton kernels for a Hopper GPU (sm_90) without one, and check they fit its shared memory.

For each kernel (forward, forward with tangent, the two backward kernels, and those two with the
tangent of the backward pass: second order), head width and
dtype, this compiles the kernel with the tile configuration `attnid.kernels.launch.tiles`
picks, through Triton's own compiler and the ptxas it ships, and reads the shared memory the
compiled kernel needs. An H100 or H200 block may use at most 227 KiB. A kernel over that
limit would fail to launch on the GPU. This check catches that here, on a machine without a GPU.
It says nothing about speed.

Run without TRITON_INTERPRET (the kernels must be compiled, not interpreted). Exit status 1 if
any kernel fails to compile or does not fit.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

HOPPER_SHARED_BYTES = 227 * 1024
POINTER_FP32 = ("Lse", "Delta", "Cos", "Sin", "Sink", "TLse", "TDelta", "Mask")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16", "fp32"])
    parser.add_argument("--mask", choices=["both", "on", "off"], default="both",
                        help="compile with an attention mask (HAS_MASK, its own tiles), without, or both")
    parser.add_argument("--kinds", nargs="+", default=["forward", "tangent", "dkdv", "dq", "dkdv_tangent", "dq_tangent"])
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnid.kernels import flash, launch

    kernels = {"forward": (flash._forward_kernel, {"HAS_SINK": True, "TANGENT": False}),
               "tangent": (flash._forward_kernel, {"HAS_SINK": True, "TANGENT": True}),
               "dkdv": (flash._backward_dkdv_kernel, {"TANGENT": False}), "dq": (flash._backward_dq_kernel, {"TANGENT": False}),
               "dkdv_tangent": (flash._backward_dkdv_kernel, {"TANGENT": True}),
               "dq_tangent": (flash._backward_dq_kernel, {"TANGENT": True})}
    target = GPUTarget("cuda", 90, 32)
    failures = 0
    print(f"{'kernel':12} {'mask':4} {'dtype':5} {'width':>5} {'tiles':>9} {'warps':>5} {'stages':>6} {'shared':>9}  verdict")
    for kind, masked in itertools.product(args.kinds, {"both": [False, True], "on": [True], "off": [False]}[args.mask]):
        kernel, flags = kernels[kind]
        for dtype in args.dtypes:
            for width in args.widths:
                block_m, block_n, warps, stages = launch.tiles(kind, width, 4 if dtype == "fp32" else 2, masked)
                consts = {"D": width, "DV": width, "D_PAD": width, "DV_PAD": width, "R": width, "CAUSAL": True,
                          "HAS_MASK": masked, "HAS_LENGTHS": masked,
                          "PRECISION": "ieee" if dtype == "fp32" else None, "BLOCK_M": block_m, "BLOCK_N": block_n, **flags}
                consts = {k: v for k, v in consts.items() if k in kernel.arg_names}
                signature = {}
                for name in kernel.arg_names:
                    if name in consts:
                        signature[name] = "constexpr"
                    elif name in POINTER_FP32:
                        signature[name] = "*fp32"
                    elif name == "KeyLen":
                        signature[name] = "*i32"
                    elif name[0].isupper():
                        signature[name] = f"*{dtype}"
                    else:
                        signature[name] = "fp32" if name == "scale" else "i32"
                start = time.perf_counter()
                try:
                    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts), target=target,
                                              options={"num_warps": warps, "num_stages": stages})
                    shared = int(compiled.metadata.shared)
                    verdict = "fits" if shared <= HOPPER_SHARED_BYTES else "TOO LARGE"
                except Exception as err:  # noqa: BLE001 - report any compiler failure and go on
                    shared, verdict = -1, f"FAILED: {str(err).splitlines()[0][:100]}"
                failures += verdict != "fits"
                print(f"{kind:12} {'yes' if masked else 'no':4} {dtype:5} {width:5} {block_m:>4}x{block_n:<4} {warps:5} {stages:6} {shared:9}  {verdict}"
                      f" ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{failures} kernel configuration(s) do not compile or do not fit {HOPPER_SHARED_BYTES} bytes")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
