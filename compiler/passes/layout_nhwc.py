"""Keep the activations of convolution regions in NHWC (channels last), with Transposes only at
the regions' edges.

The C target's NCHW convolutions pay for their layout: a 1x1 conv's output rows are a whole
plane apart, and every KxK conv repacks its input. In NHWC a conv is a GEMM whose rows are output
pixels and whose columns are output channels: the input rows are read in place and the weights
are packed ahead of time into the panels the register tile reads (``runtime/kernels/nhwc.py``).
Converting the layout around every conv costs more than it saves (20-30% per conv in the probe
of ../shared/notes/cpu-speed-findings.md), so this pass converts whole regions:

1. Candidates are the nodes that have an NHWC form: 2-D convolutions (Conv, FusedConv,
   WinogradConv) with constant weights, MaxPool (one output) / AveragePool / GlobalAveragePool,
   LRN, inference BatchNormalization with constant parameters, Concat along the channels, the
   elementwise ops (FusedElementwise included, and the one-input float maps the fusion pass leaves
   alone, such as HardSwish) whose non-constant operands are all 4-D, and
   ShuffleNet's channel shuffle (Reshape to (N, g, C/g, H, W), Transpose, Reshape back), which in
   NHWC is a Reshape to (N, H, W, g, C/g), the last two axes swapped and a Reshape back.
2. A region is a connected set of candidates linked by the 4-D tensors between them; only
   regions with at least one convolution are converted.
3. Inside a region every 4-D tensor is (N, H, W, C). A tensor entering from outside gets one
   Transpose to NHWC; one leaving it (used outside, or a graph output) one Transpose back. A
   Transpose that moves only size-1 axes (the (N, C, 1, 1) of a global pool) is a Reshape: no copy.
4. The nodes become their NHWC forms: onnx_aot.ConvNhwc / WinogradConvNhwc with weights packed
   here, once; MaxPoolNhwc, AveragePoolNhwc, GlobalAveragePoolNhwc, LRNNhwc; Concat along axis 3;
   BatchNormalization as a FusedElementwise x * s + t; elementwise ops unchanged, their constant
   operands transposed (a (C, 1, 1) constant becomes (1, 1, 1, C)).

It is a lowering for the C target (optimization level 3), run after ``use_winograd``; in a
dynamic graph too (run-time batch and spatial sizes: the NHWC kernels take them, a shuffle's
Reshapes get symbolic shape attributes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NO_ACTIVATION
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import merged_origin
from runtime.contract import AVERAGE_POOL_NHWC
from runtime.contract import CONV_NHWC
from runtime.contract import FUSED_CONV
from runtime.contract import FUSED_ELEMENTWISE
from runtime.contract import GLOBAL_AVERAGE_POOL_NHWC
from runtime.contract import LRN_NHWC
from runtime.contract import MAX_POOL_NHWC
from runtime.contract import WINOGRAD_CONV
from runtime.contract import WINOGRAD_CONV_NHWC
from runtime.contract import op_name
from runtime.kernels.elementwise import ELEMENTWISE_OPS
from runtime.kernels.elementwise import ELEMENTWISE_REFERENCE_ONLY
from runtime.kernels.nhwc import TO_NCHW
from runtime.kernels.nhwc import TO_NHWC
from runtime.kernels.nhwc import pack_conv_weights
from runtime.kernels.nhwc import pack_winograd_weights

__all__ = ["LayoutNhwc", "regions"]

CONVS = ("Conv", FUSED_CONV, WINOGRAD_CONV)
POOLS = {
    "MaxPool": op_name(MAX_POOL_NHWC),
    "AveragePool": op_name(AVERAGE_POOL_NHWC),
    "GlobalAveragePool": op_name(GLOBAL_AVERAGE_POOL_NHWC),
    "LRN": op_name(LRN_NHWC),
}


def _rank4(value: Value | None) -> bool:
    return value is not None and value.shape is not None and len(value.shape) == 4


def _float32(value: Value | None) -> bool:
    return value is not None and value.dtype == np.float32


def _float_map(node: Node) -> bool:
    """A one-input float32 map the fusion pass does not take (HardSwish, Mish, Selu, ...): as blind
    to the layout as the fusable ones, so it stays inside a region instead of splitting it."""
    return (node.kind in ELEMENTWISE_REFERENCE_ONLY and len(node.inputs) == 1 and len(node.outputs) == 1
            and _float32(node.input(0)) and _float32(node.outputs[0]))


def _sole_user(value: Value, kind: str) -> Node | None:
    user = value.uses[0].node if len(value.uses) == 1 else None
    graph = user.graph if user is not None else None
    if user is None or user.kind != kind or graph is None or graph.is_graph_output(value):
        return None
    return user


def _shuffle_chain(node: Node) -> tuple[Node, Node, Node] | None:
    """The channel shuffle ``node`` belongs to (ShuffleNet): Reshape (N, C, H, W) -> (N, g, C/g, H, W),
    Transpose (0, 2, 1, 3, 4), Reshape back to (N, C, H, W); each read only by the next."""
    def producer(n: Node | None) -> Node | None:
        v = n.input(0) if n is not None else None
        return v.producer if v is not None else None

    head: Node | None = node
    if node.kind == "Transpose":
        head = producer(node)
    elif node.kind == "Reshape" and (before := producer(node)) is not None and before.kind == "Transpose":
        head = producer(before)
    if head is None or head.kind != "Reshape":
        return None
    x, split = head.input(0), head.outputs[0]
    if not _rank4(x) or not _float32(x) or split.shape is None or len(split.shape) != 5:
        return None
    assert x is not None and x.shape is not None
    n, c, h, w = x.shape
    if split.shape[0] != n or split.shape[3:] != (h, w) or split.shape[1] * split.shape[2] != c:
        return None
    mid = _sole_user(split, "Transpose")
    if mid is None or list(mid.attrs.get("perm", ())) != [0, 2, 1, 3, 4]:
        return None
    tail = _sole_user(mid.outputs[0], "Reshape")
    if tail is None or tail.outputs[0].shape != x.shape:
        return None
    return (head, mid, tail) if node in (head, mid, tail) else None


def _shuffle_nhwc(node: Node) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The output shape and attributes of one node of a channel shuffle in NHWC: (N, H, W, g, C/g),
    the last two axes swapped, merged back to (N, H, W, C)."""
    chain = _shuffle_chain(node)
    assert chain is not None and chain[0].outputs[0].shape is not None
    n, g, cg, h, w = chain[0].outputs[0].shape
    if node is chain[0]:
        return (n, h, w, g, cg), {"shape": [n, h, w, g, cg]}
    if node is chain[1]:
        return (n, h, w, cg, g), {"perm": [0, 1, 2, 4, 3]}
    return (n, h, w, g * cg), {"shape": [n, h, w, g * cg]}


def _layout_inputs(node: Node) -> list[int] | None:
    """The input positions of ``node`` that carry activations in the region's layout, or None
    when the node has no NHWC form."""
    kind = node.kind
    if kind in ("Reshape", "Transpose"):
        return [0] if _shuffle_chain(node) is not None else None
    if len(node.outputs) != 1 or not _rank4(node.outputs[0]) or not _float32(node.outputs[0]):
        return None
    x = node.input(0)
    if kind in CONVS:
        w = node.input(1)
        if not _rank4(x) or not _float32(x) or w is None or w.const is None or len(node.inputs) > 4:
            return None
        if kind != WINOGRAD_CONV and len(node.attrs.get("kernel_shape", ())) != 2:
            return None
        b, y_shape = node.input(2), node.outputs[0].shape
        if b is not None and y_shape is not None and b.shape != (y_shape[1],):
            return None
        z = node.input(3)
        if z is not None and z.shape != node.outputs[0].shape:
            return None
        return [0, 3] if z is not None else [0]
    if kind in POOLS:
        return [0] if _rank4(x) and _float32(x) and len(node.inputs) == 1 else None
    if kind == "BatchNormalization":
        params = node.inputs[1:5]
        ok = _rank4(x) and len(params) == 4 and all(p is not None and p.const is not None for p in params)
        return [0] if ok else None
    if kind == "Concat":
        ok = node.attrs.get("axis") == 1 and all(_rank4(v) for v in node.inputs)
        return list(range(len(node.inputs))) if ok else None
    if kind in ELEMENTWISE_OPS or kind == FUSED_ELEMENTWISE or _float_map(node):
        positions = []
        for i, v in enumerate(node.inputs):
            if v is None or v.const is not None:
                continue
            if not _rank4(v):
                return None
            positions.append(i)
        return positions if positions else None
    return None


def regions(graph: Graph) -> list[list[Node]]:
    """The connected sets of NHWC-capable nodes that hold a convolution, each in graph order."""
    capable = {id(n): n for n in graph if _layout_inputs(n) is not None}
    parent = {k: k for k in capable}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for node in capable.values():
        positions = _layout_inputs(node)
        assert positions is not None
        for i in positions:
            v = node.input(i)
            if v is not None and v.producer is not None and id(v.producer) in capable:
                parent[find(id(v.producer))] = find(id(node))
    groups: dict[int, list[Node]] = {}
    for node in graph:
        if id(node) in capable:
            groups.setdefault(find(id(node)), []).append(node)
    return [nodes for nodes in groups.values() if any(n.kind in CONVS for n in nodes)]


def _permuted(shape: tuple[int, ...] | None, perm: Iterable[int]) -> tuple[int, ...]:
    assert shape is not None
    return tuple(shape[p] for p in perm)


def _only_ones_move(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """Whether transposing ``shape`` by ``perm`` keeps the element order (only size-1 axes move)."""
    kept = [p for p in perm if shape[p] != 1]
    return kept == sorted(kept)


class LayoutNhwc(Pass):
    name = "layout_nhwc"

    def run(self, graph: Graph) -> PassResult:
        found = regions(graph)
        for nodes in found:
            _Rewrite(graph, nodes).run()
        if found:
            graph.sort()
            graph.prune_constants()
        return PassResult(graph, bool(found))


class _Rewrite:
    """One region's rewrite: new NHWC nodes beside the old ones, edges wired, old nodes removed."""

    def __init__(self, graph: Graph, nodes: list[Node]) -> None:
        self.graph = graph
        self.nodes = nodes
        self.members = {id(n) for n in nodes}
        self.nhwc: dict[int, Value] = {}  # id(NCHW value) -> its NHWC value

    def run(self) -> None:
        self.absorbed = {id(n.outputs[0]): n for n in self.nodes if self._absorbable(n)}
        converted = []
        for node in self.nodes:
            if id(node.outputs[0]) in self.absorbed:
                continue
            new = self._convert(node)
            self.graph.add_node(new, before=node)
            self.nhwc[id(node.outputs[0])] = new.outputs[0]
            converted.append((node, new))
        for node, new in converted:
            self._exit(node, new)
        for node in reversed(self.nodes):
            self.graph.remove_node(node)
        for node, new in converted:  # the NHWC node takes its predecessor's name (profiles, reports)
            new.name = node.name

    # -- edges ------------------------------------------------------------------------------------

    def _transpose(self, x: Value, y: Value, perm: tuple[int, ...], name: str) -> Node:
        assert x.shape is not None
        if _only_ones_move(x.shape, perm):
            return Node("Reshape", [x], [y], {"shape": list(_permuted(x.shape, perm))}, name=name, origin=[])
        return Node("Transpose", [x], [y], {"perm": list(perm)}, name=name, origin=[])

    def _entry(self, value: Value, before: Node) -> Value:
        """The NHWC form of ``value``: the region's own, or one Transpose from outside."""
        if id(value) not in self.nhwc:
            out = self.graph.make_value(f"{value.name}_nhwc", value.dtype, _permuted(value.shape, TO_NHWC))
            name = self.graph.unique_name(f"{value.name}_to_nhwc")
            self.graph.add_node(self._transpose(value, out, TO_NHWC, name), before=before)
            self.nhwc[id(value)] = out
        return self.nhwc[id(value)]

    def _exit(self, node: Node, new: Node) -> None:
        """Hand ``node``'s output over to a Transpose back to NCHW when anything outside uses it."""
        value = node.outputs[0]
        outside = [u for u in value.uses if id(u.node) not in self.members]
        if not outside and not self.graph.is_graph_output(value):
            return
        node.outputs[0] = Value(f"{value.name}__replaced", value.dtype, value.shape)
        node.outputs[0].producer = node
        value.producer = None
        name = self.graph.unique_name(f"{value.name}_to_nchw")
        self.graph.add_node(self._transpose(new.outputs[0], value, TO_NCHW, name), after=new)

    def _absorbable(self, node: Node) -> bool:
        """A BatchNormalization read only by one FusedElementwise of the region: its x * s + t
        goes into that node's program instead of a pass of its own over the tensor."""
        if node.kind != "BatchNormalization" or self.graph.is_graph_output(node.outputs[0]):
            return False
        uses = node.outputs[0].uses
        user = uses[0].node if len(uses) == 1 else None
        return user is not None and user.kind == FUSED_ELEMENTWISE and id(user) in self.members

    # -- nodes ------------------------------------------------------------------------------------

    def _inputs(self, node: Node, positions: list[int]) -> list[Value | None]:
        inputs = list(node.inputs)
        for i in positions:
            v = inputs[i]
            assert v is not None
            if id(v) not in self.absorbed:  # replaced by its BatchNormalization's input (_absorb)
                inputs[i] = self._entry(v, node)
        return inputs

    def _convert(self, node: Node) -> Node:
        positions = _layout_inputs(node)
        assert positions is not None
        inputs = self._inputs(node, positions)
        y = node.outputs[0]
        assert y.shape is not None
        shape = _permuted(y.shape, TO_NHWC) if len(y.shape) == 4 else y.shape  # a shuffle's: _shuffle
        out = self.graph.make_value(f"{y.name}_nhwc", y.dtype, shape)
        kind = node.kind
        attrs = dict(node.attrs)
        op, domain = node.op_type, node.domain
        absorbed = [self.absorbed[id(v)] for v in node.inputs if v is not None and id(v) in self.absorbed]
        if kind in CONVS:
            w = node.input(1)
            assert w is not None and w.const is not None
            if kind == WINOGRAD_CONV:
                op, packed = op_name(WINOGRAD_CONV_NHWC), pack_winograd_weights(w.const)
            else:
                group = int(attrs["group"])
                op, packed = op_name(CONV_NHWC), pack_conv_weights(w.const, group)
                if kind == "Conv":
                    attrs.update(NO_ACTIVATION)
            panels = add_constant(self.graph, f"{w.name}_nhwc", packed)
            if op == op_name(CONV_NHWC) and panels.const is not None:  # a dequantized weight stays narrow
                self.graph.narrowing.carry(w.const, panels.const, lambda a: pack_conv_weights(a, group))
            inputs[1] = panels
            domain = AOT_DOMAIN
        elif kind in POOLS:
            op, domain = POOLS[kind], AOT_DOMAIN
        elif kind == "BatchNormalization":
            op, domain, inputs, attrs = self._batch_norm(node, inputs[0])
        elif kind == "Concat":
            attrs["axis"] = 3
        elif kind in ("Reshape", "Transpose"):
            out.shape, attrs = _shuffle_nhwc(node)
        else:
            for i, v in enumerate(inputs):
                if v is not None and v.const is not None and i not in positions:
                    inputs[i] = self._constant(v)
            if kind == FUSED_ELEMENTWISE:
                inputs, attrs["program"] = self._absorb(node, inputs, list(attrs["program"]))
        return Node(
            op,
            inputs,
            [out],
            attrs,
            name=self.graph.unique_name(f"{node.name}_nhwc"),
            domain=domain,
            origin=merged_origin([*absorbed, node]),
        )

    def _absorb(
        self, node: Node, inputs: list[Value | None], program: list[dict]
    ) -> tuple[list[Value | None], list[dict]]:
        """``inputs`` and ``program`` of a FusedElementwise with the absorbed BatchNormalizations
        among its operands computed at the start of its program."""
        prefix: list[dict] = []
        refs: dict[str, str] = {}
        operands: list[Value | None] = []
        for k, v in enumerate(inputs):
            bn = self.absorbed.get(id(node.inputs[k]))
            if bn is None:
                refs[f"i{k}"] = f"i{len(operands)}"
                operands.append(v)
                continue
            _, _, (x, sv, tv), affine = self._batch_norm(bn, self._entry(bn.inputs[0], node))  # type: ignore[arg-type]
            base, t0 = len(operands), len(prefix)
            operands += [x, sv, tv]
            prefix.append({"op": "Mul", "args": [f"i{base}", f"i{base + 1}"], "attrs": {}})
            prefix.append({"op": "Add", "args": [f"t{t0}", f"i{base + 2}"], "attrs": {}})
            refs[f"i{k}"] = f"t{t0 + 1}"
        if not prefix:
            return inputs, program

        def ref(r: str) -> str:
            return refs[r] if r.startswith("i") else f"t{int(r[1:]) + len(prefix)}"

        shifted = [{**ins, "args": [ref(r) for r in ins["args"]]} for ins in program]
        return operands, prefix + shifted

    def _constant(self, value: Value) -> Value:
        """A constant operand of an elementwise op, broadcast-aligned to rank 4 and transposed."""
        assert value.const is not None
        c = value.const
        if c.ndim > 4:
            raise AssertionError(f"{value.name}: a rank-{c.ndim} operand of a 4-D elementwise op")
        if c.size == 1 and c.ndim <= 1:
            return value
        full = c.reshape((1,) * (4 - c.ndim) + c.shape)
        return add_constant(self.graph, f"{value.name}_nhwc", np.ascontiguousarray(full.transpose(TO_NHWC)))

    def _batch_norm(self, node: Node, x: Value | None) -> tuple[str, str, list[Value | None], dict]:
        """Inference BatchNormalization as x * s + t with per-channel (1, 1, 1, C) constants."""
        consts = []
        for v in node.inputs[1:5]:
            assert v is not None and v.const is not None
            consts.append(v.const.astype(np.float64).reshape(-1))
        scale, bias, mean, var = consts
        s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        t = bias - mean * s
        sv = add_constant(self.graph, f"{node.name}_scale_nhwc", s.astype(np.float32).reshape(1, 1, 1, -1))
        tv = add_constant(self.graph, f"{node.name}_shift_nhwc", t.astype(np.float32).reshape(1, 1, 1, -1))
        program = [
            {"op": "Mul", "args": ["i0", "i1"], "attrs": {}},
            {"op": "Add", "args": ["t0", "i2"], "attrs": {}},
        ]
        return op_name(FUSED_ELEMENTWISE), AOT_DOMAIN, [x, sv, tv], {"program": program}
