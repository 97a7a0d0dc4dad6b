"""The CUDA execution provider, compile side: claims nodes, renders one .cu, builds cubins + PTX.

``CudaProvider.claims`` asks the kernel registry (filled by the modules of
``KERNEL_MODULES``) which float32 nodes it can run, and always claims ``onnx_aot.Transfer`` (the
run side performs those copies; they get no kernel). ``generate`` renders every kernel of every
partition from ``templates/cuda`` into ``kernels_dir/model.cu`` and, when nvcc is present,
builds ``model.sm_80.cubin``, ``model.sm_90.cubin`` and ``model.ptx`` (compute_80) through the
cached toolchain (``compiler/codegen/nvcc.py``).

The contract with ``runtime/providers/cuda.py`` (``generate`` returns a ``GeneratedCuda``; the
artifact writer puts each step's ``launches`` into its plan.json record):

- kernels are ``extern "C" __global__`` functions named ``k<step index>`` (``k<step>_<j>`` when
  a step has several); a step whose kernel would be identical but for the name reuses the
  first one's function (ResNet repeats its blocks);
- a step's ``launches`` is a list, run in order, of ``{"kernel", "grid": [x, y, z],
  "block": [x, y, z], "shared": bytes of dynamic shared memory, "args": [...]}``; an arg is
  ``["ptr", "arena", byte offset]`` (the device arena, 256-byte aligned), ``["ptr", "weights",
  byte offset]`` (the device copy of weights.bin), ``["i32", int]``, ``["i64", int]`` or
  ``["f32", float]``, in the order of the kernel's parameters. Transfers and views onto the
  same bytes have ``[]``. In a dynamic plan a grid size, an ``i32`` (a run-time dim) and an arena
  offset may be an expression's text, evaluated by the runtime at each binding
  (``common.RunDims``; docs/cuda.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.codegen.env import render
from compiler.codegen.nvcc import DEFAULT_ARCHS
from compiler.codegen.nvcc import DEFAULT_PTX_ARCH
from compiler.codegen.nvcc import build_cuda
from compiler.codegen.nvcc import find_nvcc
from compiler.codegen.nvcc import min_driver
from compiler.codegen.options import BuildOptions
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.providers.base import GeneratedCuda
from compiler.providers.base import GenPartition
from compiler.providers.cuda import elementwise
from compiler.providers.cuda import gemm
from compiler.providers.cuda import movement
from compiler.providers.cuda import norm
from compiler.providers.cuda import pool
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import ranges
from compiler.providers.kit import KernelTable
from compiler.providers.kit import comment
from runtime.contract import TRANSFER
from runtime.errors import CompileError
from runtime.plan_schema import KernelLaunch
from runtime.symbolic import Expr
from runtime.symbolic import bounds

__all__ = ["CudaProvider", "CudaModelContext", "TRANSFER", "KERNEL_MODULES"]

# The modules whose ``KERNELS`` the CUDA provider runs; every other module of this package is named
# in SUPPORT_MODULES (a test checks that none is left out).
KERNEL_MODULES = (elementwise, gemm, movement, norm, pool)
SUPPORT_MODULES = ("provider", "common")
KERNELS: KernelTable[CudaKernel] = KernelTable("CUDA", KERNEL_MODULES)

SOURCE_NAME = "model.cu"
MAX_THREADS = 1024
_ARCH_LIST = re.compile(r"\s*,\s*")


@dataclass(frozen=True)
class CudaModelContext:
    n_kernels: int
    functions: tuple[str, ...]


class CudaProvider:
    """Generated CUDA kernels for float32 ops, built ahead of time with nvcc when present."""

    name = "cuda"
    runner = "cuda"
    memory_space = "cuda"
    alignment = 256

    def supports(self, node: Node) -> bool:
        """Whether a CUDA kernel handles ``node`` with its attributes, dtypes and shapes."""
        return node.kind == TRANSFER or KERNELS.supports(node)

    def claims(self, graph: Graph) -> set[Node]:
        return {node for node in graph.nodes if self.supports(node)}

    def scratch_nbytes(self, node: Node) -> int:
        return 0 if node.kind == TRANSFER else KERNELS.scratch_nbytes(node)

    def render(self, partitions: list[GenPartition]) -> tuple[str, dict[int, tuple[KernelLaunch, ...]]]:
        """The model's CUDA source and each step's launches (deterministic: no paths or times)."""
        functions: list[str] = []
        launches: dict[int, tuple[KernelLaunch, ...]] = {}
        # (template, context) -> the name of the function rendered for it
        shared: dict[tuple[str, Any], str] = {}
        for part in partitions:
            if part.provider != self.name:
                raise CompileError(
                    f"partition {part.index} belongs to provider {part.provider!r}, not 'cuda'"
                )
            for step in part.steps:
                key = step.index
                if key in launches:
                    raise CompileError(f"step {step.index} appears twice in the CUDA partitions")
                node = step.node
                if node.kind == TRANSFER:
                    launches[key] = ()
                    continue
                codes = KERNELS.kernel(node).build(step)
                records = []
                for j, code in enumerate(codes):
                    self._check(code, node)
                    name = f"k{step.index}" if len(codes) == 1 else f"k{step.index}_{j}"
                    sig = (code.template, code.ctx)
                    if sig not in shared:
                        shared[sig] = name
                        functions.append(render(code.template, code.ctx, name=name, comment=comment(node)))
                    records.append(KernelLaunch(shared[sig], code.grid, code.block, code.shared, code.args))
                launches[key] = tuple(records)
        source = render("cuda/model.cu.j2", CudaModelContext(len(functions), tuple(functions)))
        return source, launches

    @staticmethod
    def _check(code: KernelCode, node: Node) -> None:
        """The launch fits CUDA's limits, and a run-time dim an ``int`` parameter (a run-time grid
        or dim at every binding: its bounds over the symbols' ranges)."""
        threads = code.block[0] * code.block[1] * code.block[2]
        span = ranges(node)
        low = [bounds(g, span)[0] if isinstance(g, Expr) else g for g in code.grid]
        grid = tuple(bounds(g, span)[1] if isinstance(g, Expr) else g for g in code.grid)
        if min(low) < 1 or min(code.block) < 1 or threads > MAX_THREADS:
            raise CompileError(f"{node.describe()}: bad launch grid {code.grid} block {code.block}")
        if grid[1] > 65535 or grid[2] > 65535 or grid[0] > 2**31 - 1:
            raise CompileError(f"{node.describe()}: launch grid {code.grid} exceeds CUDA limits")
        for arg in code.args:
            if arg.kind == "i32" and isinstance(arg.value, Expr):
                lo, hi = bounds(arg.value, span)
                if lo < -(2**31) or hi > 2**31 - 1:
                    raise CompileError(f"{node.describe()}: run-time dim {arg.value} spans {lo}..{hi}, "
                                       f"past a 32-bit int")

    def generate(
        self, partitions: list[GenPartition], kernels_dir: Path, options: BuildOptions
    ) -> GeneratedCuda:
        """Write ``kernels_dir/model.cu`` and, with nvcc, its cubins and PTX; say what was written.

        ``options.extra`` may set ``cuda_archs`` ("sm_80,sm_90"), ``cuda_ptx`` ("compute_80";
        "" for none), ``nvcc`` (a path; "none" skips the build) and ``nvcc_flags``.
        """
        kernels_dir = Path(kernels_dir)
        source, launches = self.render(list(partitions))
        kernels_dir.mkdir(parents=True, exist_ok=True)
        (kernels_dir / SOURCE_NAME).write_text(source)
        archs = tuple(
            a for a in _ARCH_LIST.split(options.extra.get("cuda_archs", ",".join(DEFAULT_ARCHS))) if a
        )
        ptx_arch = options.extra.get("cuda_ptx", DEFAULT_PTX_ARCH) or None
        nvcc = find_nvcc(options)
        if nvcc is None or not (archs or ptx_arch):
            return GeneratedCuda(SOURCE_NAME, {}, None, None, None, None, None, None, launches)
        built = build_cuda(source, kernels_dir, options, nvcc, archs, ptx_arch)
        return GeneratedCuda(
            source=SOURCE_NAME,
            cubins=dict(built.cubins),
            ptx=built.ptx,
            ptx_arch=ptx_arch if built.ptx else None,
            nvcc_version=built.nvcc_version,
            cuda_version=built.cuda_version,
            min_driver=min_driver(built.cuda_version),
            nvcc_flags=tuple(built.flags),
            launches=launches,
        )
