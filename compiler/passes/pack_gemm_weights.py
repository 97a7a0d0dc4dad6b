"""Pack the constant B of a Gemm into the C tile's column panels, once, ahead of time.

The C provider's register tile loads B along the output columns, a panel of up to 64 columns at a
time, so a Gemm read B (N, K) transposed or (K, N) in place through a copy into panels in scratch
**at every run**: for a CRNN's 1024 -> 8210 classifier 33.6 MB per run, about 30% of the step
(transposed, it was 7 of 24 ms). When B is a constant, this lowering stores it packed instead
(``runtime/kernels/linalg.py: pack_b_panels``: (ceil(N / 64), K, 64), zero-padded; one layout for
every target's tile, 64 being a multiple of each tile width) and the Gemm / FusedGemm becomes
``onnx_aot.PackedGemm`` (FusedGemm's attributes without transB, plus ``n``, B's columns).

Left alone: products with few rows (the C kernel runs them as dot products along K, which wants B
as it is; ``DOT_MAX_ROWS``), transA, a B whose padding would add more than an eighth of its size
(a narrow B), and a constant read by anything but such Gemms (packing it would store the weights
twice). A lowering for the C target (``compiler.passes.lowerings_for``), from level 2; in a dynamic
graph too (rows an expression of the symbols: the C kernel takes them at run time).

``precision="bf16"`` (``--precision``, compiler/precision.py) rounds each packed B to bfloat16 (to
nearest even) and stores the codes in AMX-BF16's pair layout (``runtime/kernels/amx_pack.py``: half
the bytes, read as they are by the C kernel's AMX path and widened per run where the CPU lacks
AMX-BF16); a B the model ships narrow already keeps its own form.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.ir.narrow import Affine
from compiler.passes.base import NO_ACTIVATION
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import replace_nodes
from compiler.precision import to_bf16
from compiler.providers.c.gemm import DOT_MAX_ROWS
from runtime.contract import FUSED_GEMM
from runtime.contract import PACKED_GEMM
from runtime.contract import op_name
from runtime.kernels.amx_pack import pack_amx_bf16
from runtime.kernels.linalg import B_PANEL
from runtime.kernels.linalg import pack_b_panels

__all__ = ["PackGemmWeights"]

_GEMMS = ("Gemm", FUSED_GEMM)


def _b_matrix(node: Node) -> np.ndarray | None:
    """B as (K, N) when ``node`` is a Gemm this lowering packs; else None."""
    if node.kind not in _GEMMS or node.attrs.get("transA") != 0 or node.attrs.get("transB") not in (0, 1):
        return None
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    if a is None or b is None or b.const is None or b.const.ndim != 2 or a.shape is None or len(a.shape) != 2:
        return None
    rows = a.shape[0]  # an Expr in a dynamic graph: the C kernel then runs every row count on the tile
    if not (a.dtype == b.dtype == y.dtype == np.float32) or (isinstance(rows, int) and rows <= DOT_MAX_ROWS):
        return None
    matrix = b.const.T if node.attrs["transB"] else b.const
    n = int(matrix.shape[1])
    return matrix if 8 * (-(-n // B_PANEL) * B_PANEL - n) <= n else None


def _carry(graph: Graph, b: Value, panels: Value, transposed: bool) -> None:
    """A dequantized B's panels stay narrow too (compiler/ir/narrow.py)."""
    assert b.const is not None and panels.const is not None

    def move(array: np.ndarray) -> np.ndarray:
        return pack_b_panels(array.T if transposed else array)

    graph.narrowing.carry(b.const, panels.const, move)


def _panels(graph: Graph, b: Value, matrix: np.ndarray, transposed: bool, bf16: str) -> Value:
    """B's packed panels as a new constant. Where ``bf16`` ("amx" or "panels") and B has no narrow
    form of its own, rounded to bfloat16: "amx" laid out for AMX-BF16 (uint16 codes), "panels" (run-
    time rows) fp32 panels of the rounded values stored as bfloat16 codes; the fp32 original panels
    recorded for the golden cases. Else carried as B is stored."""
    assert b.const is not None
    panels = pack_b_panels(np.asarray(matrix))
    if not bf16 or graph.narrowing.affine_of(b.const) is not None:
        value = add_constant(graph, f"{b.name}_panels", panels)
        _carry(graph, b, value, transposed)
        return value
    if bf16 == "amx":
        codes = to_bf16(np.ascontiguousarray(matrix, np.float32)).view(np.uint16)
        value = add_constant(graph, f"{b.name}_bf16", pack_amx_bf16(codes))
    else:
        rounded = to_bf16(panels)
        value = add_constant(graph, f"{b.name}_panels", rounded.astype(np.float32))
        assert value.const is not None
        graph.narrowing.record(value.const, Affine(rounded, None, None))
    assert value.const is not None
    graph.narrowing.rounded[id(value.const)] = (value.const, panels)
    return value


def _static_rows(b: Value) -> bool:
    """Every Gemm reading ``b`` has a static row count (the AMX-BF16 kernel's A blocks)."""
    return all((a := c.input(0)) is not None and a.shape is not None and isinstance(a.shape[0], int)
               for c in b.consumers())


class PackGemmWeights(Pass):
    name = "pack_gemm_weights"

    def __init__(self, precision: str = "fp32") -> None:
        self.bf16 = precision == "bf16"

    def run(self, graph: Graph) -> PassResult:
        packed: dict[tuple[int, int], Value] = {}  # (id(B), transB) -> panels, shared by the Gemms of one B
        modified = False
        for node in list(graph):
            matrix = _b_matrix(node)
            b = node.input(1)
            if matrix is None or b is None or any(_b_matrix(c) is None for c in b.consumers()):
                continue
            key = (id(b), int(node.attrs["transB"]))
            if key not in packed:
                layout = ("amx" if _static_rows(b) else "panels") if self.bf16 else ""
                packed[key] = _panels(graph, b, matrix, bool(key[1]), layout)
            attrs = {**(node.attrs if node.domain == AOT_DOMAIN else {**node.attrs, **NO_ACTIVATION}),
                     "n": int(matrix.shape[1])}
            del attrs["transB"]
            lowered = Node(op_name(PACKED_GEMM), [node.input(0), packed[key], *node.inputs[2:]],
                           list(node.outputs), attrs, name=node.name, domain=AOT_DOMAIN, origin=node.origin)
            replace_nodes(graph, [node], lowered)
            modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
