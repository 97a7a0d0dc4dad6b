"""ONNX ModelProto -> IR Graph with static shapes and canonical op forms.

Initializers (including those older models also list as graph inputs) become constants. Every node
whose inputs are all known at compile time is evaluated right here (``folding.py``: no list of
ops; random ops and large results excepted), because canonical forms need such values (a
Reshape's target shape, a Pad's pads) at compile time; an output shape onnx's whole-model
inference leaves unknown is inferred for its node alone from what is known of its inputs. A shape
that still cannot be known is an error naming the node, the input and the graph inputs it comes
from (``Knowledge.explain``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.batch_infer import OutputTypes
from compiler.frontend.batch_infer import infer_many
from compiler.frontend.canonical import COMPILE_TIME_INPUTS
from compiler.frontend.canonical import CanonContext
from compiler.frontend.canonical import canonicalize
from compiler.frontend.canonical import np_dtype_of
from compiler.frontend.canonical import onnx_attrs
from compiler.frontend.control import CONTROL_FLOW_OPS
from compiler.frontend.control import ControlScope
from compiler.frontend.control import import_control_flow
from compiler.frontend.control import is_control_flow
from compiler.frontend.control import names_in
from compiler.frontend.control import outer_names
from compiler.frontend.control import referenced_names
from compiler.frontend.control import subgraphs
from compiler.frontend.control import walk_nodes
from compiler.frontend.dims import dim_label
from compiler.frontend.dims import known_size
from compiler.frontend.fit_check import verify_fits
from compiler.frontend.folding import Knowledge
from compiler.frontend.folding import Producer
from compiler.frontend.loader import bind_input_dims
from compiler.frontend.loader import bind_input_values
from compiler.frontend.loader import infer_shapes
from compiler.frontend.loader import load_model
from compiler.frontend.loader import opset_of
from compiler.frontend.probing import Probes
from compiler.frontend.probing import atoms_of
from compiler.frontend.probing import fit
from compiler.frontend.probing import may_be_equal
from compiler.frontend.qgemm_shapes import qgemm_types
from compiler.frontend.qlstm_shapes import qlstm_types
from compiler.frontend.qoperator_shapes import qoperator_types
from compiler.frontend.same_shape import same_shape
from compiler.frontend.same_shape import slice_shape
from compiler.frontend.sequences import SEQUENCE_OPS
from compiler.frontend.sequences import OptValue
from compiler.frontend.sequences import SeqValue
from compiler.frontend.sequences import graph_outputs
from compiler.frontend.sequences import import_sequence_op
from compiler.frontend.sequences import is_sequence_node
from compiler.frontend.sequences import refuse_sequences
from compiler.frontend.value_symbols import ValueSymbol
from compiler.frontend.value_symbols import symbolic_input
from compiler.frontend.value_symbols import value_symbols
from compiler.frontend.window_ranges import window_rule
from compiler.frontend.window_shapes import infer_with_pool_sizes
from compiler.ir.evaluate import concrete_shape
from compiler.ir.graph import Graph
from compiler.ir.graph import Value
from compiler.ir.narrow import shipped_widths
from compiler.limits import check_tensor_size
from runtime.errors import ModelError
from runtime.errors import ShapeError
from runtime.errors import UnsupportedOpError
from runtime.symbolic import Expr
from runtime.symbolic import bounds
from runtime.symbolic import evaluate as sym_evaluate
from runtime.symbolic import simplify
from runtime.symbolic import sym

__all__ = ["import_model", "graph_from_proto"]

def import_model(
    model: str | os.PathLike[str] | onnx.ModelProto,
    shapes: Mapping[str, Sequence[Any]] | None = None,
    binds: Mapping[str, Any] | None = None,
    dims: Mapping[str, Any] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Graph:
    """Load, check, bind values and shapes and convert ``model`` into a verified IR graph.

    ``shapes`` (``--shape``) and ``dims`` (``--dim``) may give a dim a range ``(LO, HI)``: it is
    imported as a symbol (``Graph.symbols``), see docs/dynamic-shapes.md. ``values`` (``--value``)
    makes one-element integer / bool inputs *value symbols* (compiler/frontend/value_symbols.py)."""
    large: dict[str, onnx.TensorProto] = {}
    proto = load_model(model, large)
    proto = bind_input_values(proto, binds)
    bound = bind_input_dims(proto, shapes, dims, constants=set(large))
    found = value_symbols(bound.proto, values, list(bound.ranges))
    return graph_from_proto(bound.proto, large, bound.ranges, found)


def graph_from_proto(proto: onnx.ModelProto,
                     large: dict[str, onnx.TensorProto] | None = None,
                     ranges: dict[str, tuple[int, int]] | None = None,
                     values: Mapping[str, ValueSymbol] | None = None) -> Graph:
    """Build the IR from ``proto``; ``large`` holds initializers kept out of it (see load_model);
    ``ranges`` are the symbols' ranges, for the dims whose ``dim_param`` names one; ``values`` the
    value symbols, by input name."""
    opset = opset_of(proto)
    reject_unknown_ops(proto)
    inferred = infer_shapes(proto)
    g_proto = inferred.graph
    types = _type_table(g_proto)
    graph = Graph(g_proto.name or "model", opset)
    graph.symbols = dict(ranges or {})
    values = values or {}
    for input_name, (symbol, lo, hi) in values.items():
        graph.symbols[symbol] = (lo, hi)
        graph.value_symbols[symbol] = input_name
    env: dict[str, Value] = {}

    initializers = {t.name: t for t in g_proto.initializer}
    initializers.update(large or {})
    _add_initializers(graph, initializers, env)
    graph.narrowing.widths = _shipped_widths(g_proto, graph)
    _add_inputs(graph, g_proto, types, initializers, values, env)

    used = frozenset(referenced_names(g_proto))  # (subgraphs read outer values by name too)
    node_names: set[str] = set()
    knowledge = Knowledge((v.name for v in graph.inputs), graph.symbols)
    knowledge.input_shapes = {v.name: tuple(v.shape or ()) for v in graph.inputs}

    def import_one(at: ControlScope, node_proto: onnx.NodeProto, used_here: frozenset[str],
                   k: int = 0) -> None:
        if is_control_flow(node_proto):  # If / Loop / Scan (frontend/control/)
            name = node_proto.name or f"{node_proto.op_type}_{k}"
            reads = [*node_proto.input, *(n for sub in subgraphs(node_proto) for n in outer_names(sub))]
            with _symbolic_guard(f"node {name!r} ({node_proto.op_type})", "control flow",
                                 [at.env.get(n) for n in dict.fromkeys(reads) if n]):
                import_control_flow(at, node_proto, name)
            _note_control_flow(knowledge, at.env, node_proto, name)
        elif is_sequence_node(node_proto, at.env):  # a static sequence (frontend/sequences.py)
            import_sequence_op(at, node_proto, node_proto.name or f"{node_proto.op_type}_{k}")
        else:
            _import_node(at.graph, node_proto, k, at.env, types, opset, used_here, node_names, knowledge)

    scope = ControlScope(graph, env, types, opset, list(inferred.opset_import), used, names_in(g_proto),
                         import_one, knowledge.samples)
    for k, node_proto in enumerate(_ordered(g_proto, env)):
        import_one(scope, node_proto, used, k)

    _add_outputs(graph, g_proto, env)
    graph.prune_constants()
    if graph.symbols:
        _simplify_symbols(graph)
    graph.verify()
    return graph


def _add_inputs(graph: Graph, g_proto: onnx.GraphProto, types: dict[str, onnx.TypeProto],
                initializers: Mapping[str, onnx.TensorProto], values: Mapping[str, ValueSymbol],
                env: dict[str, Value]) -> None:
    """The graph inputs that are not initializers, as inputs of ``graph`` (and in ``env``); a value
    symbol's input is read by the nodes as its symbol."""
    for inp in g_proto.input:
        if inp.name in initializers:
            continue  # older models list initializers as inputs too: they are constants
        dtype, shape = _static_type(types, inp.name, f"graph input {inp.name!r}", graph.symbols)
        env[inp.name] = graph.add_input(Value(inp.name, dtype, shape))
        if inp.name in values:  # the nodes read the symbol (the runtime reads it off the feed)
            env[inp.name] = symbolic_input(graph, env[inp.name], values[inp.name][0])


def _add_outputs(graph: Graph, g_proto: onnx.GraphProto, env: Mapping[str, Value]) -> None:
    """The graph outputs as outputs of ``graph``; a sequence's elements as outputs NAME.0, ..."""
    for out in g_proto.output:
        if out.name not in env:
            raise ModelError(f"graph output {out.name!r} is produced by no node")
        value = env[out.name]
        if isinstance(value, (SeqValue, OptValue)):
            for public, item in graph_outputs(out.name, value):
                graph.add_output(item, public)
            continue
        if value.shape is None:
            raise ShapeError(f"graph output {out.name!r} has no static shape")
        graph.add_output(value, out.name)


def _add_initializers(graph: Graph, initializers: Mapping[str, onnx.TensorProto],
                      env: dict[str, Value]) -> None:
    """Each initializer as a constant of ``graph`` (and in ``env``, by name)."""
    for name, tensor in initializers.items():
        try:
            array = numpy_helper.to_array(tensor)
        except Exception as exc:
            raise ModelError(f"initializer {name!r} cannot be read: {exc}") from None
        np_dtype_of(tensor.data_type, f"initializer {name!r}")
        value = Value(name, const=np.ascontiguousarray(array).reshape(array.shape))
        graph.constants[name] = value
        graph.reserve_name(name)
        env[name] = value


def _simplify_symbols(graph: Graph) -> None:
    """Fold what the symbols' ranges decide in every shape, attribute and symbolic constant
    (``min(1, W)``, a Slice start clamped to a dim that is never below 1, is 1)."""
    def fold(item: Any) -> Any:
        if isinstance(item, Expr):
            return simplify(item, graph.symbols)
        if isinstance(item, (list, tuple)) and any(isinstance(d, Expr) for d in item):
            return type(item)(fold(d) for d in item)
        if isinstance(item, np.ndarray) and item.dtype == object:
            out = np.empty(item.shape, object)
            out.reshape(-1)[:] = [fold(d) for d in item.reshape(-1)]
            return out
        return item

    for value in graph.values():
        if value.shape is not None:
            value.shape = fold(value.shape)
        if value.const is not None and value.const.dtype == object:
            const = fold(value.const)
            symbolic = any(isinstance(d, Expr) for d in const.reshape(-1))
            value.const = const if symbolic else const.astype(value.dtype)
    for node in graph.nodes:
        node.attrs = {key: fold(item) for key, item in node.attrs.items()}
    graph.assumptions = [(name, fold(a), fold(b)) for name, a, b in graph.assumptions if fold(a) != fold(b)]


# ONNX ops the frontend rewrites into another canonical kind (see docs/ops.md)
CANONICAL_KIND = {"Flatten": "Reshape", "Squeeze": "Reshape", "Unsqueeze": "Reshape",
                  "Dropout": "Identity", "Constant": "Constant"}


def reject_unknown_ops(proto: onnx.ModelProto) -> None:
    """Fail early, listing every node whose op no provider can run at all.

    The reference provider implements every op onnx-aot accepts, so its registry is the
    complete list. This runs before shape inference, which cannot see through unknown ops.
    """
    from compiler.frontend.canonical import canonical_op_types
    from runtime.kernels import supported_kinds

    # Constant and Size become constants at import; canonicalized ops are checked once rewritten
    kinds = supported_kinds() | {"Constant", "Size"} | canonical_op_types() | SEQUENCE_OPS
    from compiler.frontend.canonical.index import DATA_DEPENDENT_OPS

    nodes = list(walk_nodes(proto.graph))  # subgraphs' nodes too
    dynamic = [(node.name or f"{node.op_type}_{k}", node.op_type) for k, node in enumerate(nodes)
               if node.domain in ("", "ai.onnx") and node.op_type in DATA_DEPENDENT_OPS]
    if dynamic:
        listed = "\n  ".join(f"{name} ({op})" for name, op in dynamic)
        raise UnsupportedOpError(f"{len(dynamic)} node(s) have output shapes that depend on input values, "
                                 f"which ahead-of-time compilation cannot know:\n  {listed}", dynamic)
    graphs = [(node.name or f"{node.op_type}_{k}", node.op_type) for k, node in enumerate(nodes)
              if subgraphs(node) and not is_control_flow(node) and node.op_type != "SequenceMap"]
    kinds |= CONTROL_FLOW_OPS
    bad = []
    for k, node in enumerate(nodes):
        domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        kind = CANONICAL_KIND.get(node.op_type, node.op_type) if not domain else f"{domain}.{node.op_type}"
        if kind not in kinds:
            bad.append((node.name or f"{node.op_type}_{k}", node.op_type if not domain else kind))
    bad += [entry for entry in graphs if entry not in bad]  # subgraphs other than If/Loop/Scan's
    if bad:
        listed = "\n  ".join(f"{name} ({op})" for name, op in bad)
        raise UnsupportedOpError(f"{len(bad)} node(s) use ops onnx-aot does not support:\n  {listed}", bad)


def _type_table(g_proto: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    table: dict[str, onnx.TypeProto] = {}
    for info in list(g_proto.input) + list(g_proto.value_info) + list(g_proto.output):
        table[info.name] = info.type
    return table


def _static_type(types: dict[str, onnx.TypeProto], name: str, what: str,
                 symbols: Mapping[str, tuple[int, int]] | None = None) -> tuple[np.dtype, tuple[int, ...]]:
    """``name``'s dtype and shape: every dim a size, or one of ``symbols`` (a ``dim_param`` naming
    a symbol of the graph, with its range); anything else is a ShapeError."""
    symbols = symbols or {}
    ttype = types.get(name)
    if ttype is not None and ttype.WhichOneof("value") not in (None, "tensor_type"):
        kind = ttype.WhichOneof("value").replace("_type", "")
        article = "an" if kind[0] in "aeiou" else "a"
        raise UnsupportedOpError(f"{what} is {article} {kind}; onnx-aot supports tensor values only here "
                                 "(sequences and optionals are resolved inside the graph; the ONNX backend "
                                 "feeds a sequence input as its elements: docs/ops.md)")
    if ttype is None or not ttype.HasField("tensor_type"):
        raise ShapeError(f"{what} has no known tensor type")
    tt = ttype.tensor_type
    dtype = np_dtype_of(tt.elem_type, what)
    if not tt.HasField("shape"):
        raise ShapeError(f"{what} has no known shape")
    dims: list[Any] = []
    for k, dim in enumerate(tt.shape.dim):
        size = known_size(dim)  # None: a dim_param, no value or a negative value (dims.py)
        if size is None and dim.HasField("dim_param") and dim.dim_param in symbols:
            dims.append(sym(dim.dim_param))
            continue
        if size is None:
            raise ShapeError(f"{what} has a non-static dim {k} ({dim_label(dim)})")
        dims.append(size)
    check_tensor_size(what, dtype, [bounds(d, symbols)[1] for d in dims])
    return dtype, tuple(dims)


def _ordered(g_proto: onnx.GraphProto, env: dict[str, Value]) -> list[onnx.NodeProto]:
    """The nodes in a topological order (ONNX requires one; repair mild violations)."""
    nodes = list(g_proto.node)
    ready = set(env) | {""}
    out: list[onnx.NodeProto] = []
    pending = nodes
    while pending:
        rest = []
        for node in pending:
            if all(name in ready for name in node.input):
                out.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            node = rest[0]
            missing = [n for n in node.input if n not in ready]
            producers = {o for n in rest for o in n.output}
            if any(m in producers for m in missing):
                raise ModelError(f"graph has a cycle through node {node.name!r} ({node.op_type})")
            raise ModelError(
                f"node {node.name!r} ({node.op_type}) reads {missing[0]!r}, which nothing produces"
            )
        pending = rest
    return out


def _import_node(graph: Graph, proto: onnx.NodeProto, index: int, env: dict[str, Value],
                 types: dict[str, onnx.TypeProto], opset: int, used: frozenset[str],
                 node_names: set[str], knowledge: Knowledge) -> None:
    # Keep the ONNX node name (messages and plan.json name it) unless another node has it; a value
    # of the same name does not matter, node and value names are checked apart.
    if proto.name and proto.name not in node_names:
        name = proto.name
        graph.reserve_name(name)
    else:
        name = graph.unique_name(proto.name or f"{proto.op_type}_{index}")
    node_names.add(name)
    where = f"node {name!r} ({proto.op_type})"
    inputs: list[Value | None] = [env[n] if n else None for n in proto.input]
    refuse_sequences(inputs, where, (name, proto.op_type))
    if proto.op_type == "Constant" and proto.domain in ("", "ai.onnx"):
        env[proto.output[0]] = _constant(graph, proto, where)
        graph.eliminated[name] = "constant"
        return
    if proto.op_type == "Size" and proto.domain in ("", "ai.onnx"):  # static shapes: always known
        x = inputs[0]
        assert x is not None
        size = np.empty((), object if x.is_symbolic else np.int64)
        size[()] = x.size  # (an expression of the symbols where x's shape is symbolic)
        _fold_into(graph, env, {proto.output[0]: size}, name, {proto.output[0]: np.dtype(np.int64)})
        return
    sampled = _propagate_samples(proto, inputs, knowledge, opset) if knowledge.samples else {}
    outputs = _output_values(proto, inputs, types, where, opset, used, knowledge, sampled)
    ctx = CanonContext(proto, name, onnx_attrs(proto), inputs, outputs, opset, graph, used,
                       explain=knowledge.explain)
    with _symbolic_guard(where, "its canonical form", [*inputs, *outputs]):
        nodes = canonicalize(ctx)
    if all(v.dtype is not None and v.shape is not None and v.size == 0 for v in outputs):
        # an empty tensor (a zero dim) holds no data: known whatever the inputs, and no kernel sees it
        _fold_into(graph, env, {v.name: np.zeros(v.shape or (), v.dtype) for v in outputs}, name)
        graph.eliminated[name] = "empty tensor"
        return
    folded = knowledge.fold(proto, name, nodes, outputs)
    if folded is not None:
        _fold_into(graph, env, folded, name, {v.name: v.dtype for v in outputs if v.dtype is not None})
        result = env[next(iter(folded))].const if len(folded) == 1 else None
        if len(nodes) == 1 and result is not None:  # narrow weights (compiler/ir/narrow.py)
            graph.narrowing.note_fold(nodes[0].kind, nodes[0].attrs,
                                      [v.const if v is not None else None for v in nodes[0].inputs], result)
        return
    for node in nodes:
        graph.add_node(node)
        node_names.add(node.name)
    for value in outputs:
        env[value.name] = value
        if value.name in sampled:
            knowledge.samples[id(value)] = (value, sampled[value.name])
    if knowledge.probes is not None and any(v is not None and v.is_symbolic for v in inputs):
        _record_assumptions(graph, proto, name, inputs)


# ops whose inputs broadcast against each other (numpy rules): their dims must agree or be 1
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where",
                           "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
                           "PRelu", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})


def _record_assumptions(graph: Graph, proto: onnx.NodeProto, name: str, inputs: list[Value | None]) -> None:
    """Dims of ``proto``'s inputs that must be equal (a Concat's other dims, MatMul's inner dims,
    broadcast dims neither of which can be 1) but are different expressions: each equality goes in
    ``graph.assumptions`` for the runtime to check at a binding; dims equal at no probe size are a
    ShapeError."""
    if proto.domain not in ("", "ai.onnx"):
        return
    shapes = [v.shape for v in inputs if v is not None and v.shape is not None]
    for what, dims in _must_agree(proto, shapes, graph.symbols):
        for other in dims[1:]:
            if other == dims[0]:
                continue
            if not may_be_equal(dims[0], other, graph.symbols):
                raise ShapeError(f"node {name!r} ({proto.op_type}): its inputs' {what} ({dims[0]} and "
                                 f"{other}) differ at every size in the ranges; check the --shape / --dim "
                                 f"ranges")
            graph.assumptions.append((name, dims[0], other))


def _must_agree(proto: onnx.NodeProto, shapes: list[tuple[Any, ...]],
                ranges: Mapping[str, tuple[int, int]]) -> list[tuple[str, list[Any]]]:
    """Groups of input dims ``proto`` needs equal: ``(what, dims)``."""
    concat = proto.op_type == "Concat"
    if proto.op_type == "MatMul" and len(shapes) == 2 and min(map(len, shapes)) >= 1:
        a, b = shapes
        inner = [("inner dims", [a[-1], b[-2] if len(b) >= 2 else b[0]])]
        return inner + _must_agree_broadcast([a[:-2], b[:-2]], ranges)
    if not (concat or proto.op_type in _BROADCASTING):
        return []
    if not concat:
        return _must_agree_broadcast(shapes, ranges)
    rank = max((len(shape) for shape in shapes), default=0)
    axis = int(onnx_attrs(proto).get("axis", 0)) % max(rank, 1)
    return [(f"dim {k}", [shape[k] for shape in shapes if len(shape) == rank])
            for k in range(rank) if k != axis]


def _must_agree_broadcast(shapes: list[tuple[Any, ...]],
                          ranges: Mapping[str, tuple[int, int]]) -> list[tuple[str, list[Any]]]:
    """Dims aligned from the right where no input's dim can be 1 (one that may be 1 broadcasts)."""
    rank = max((len(shape) for shape in shapes), default=0)
    groups = []
    for k in range(rank):
        dims = [shape[k - rank + len(shape)] for shape in shapes if k - rank + len(shape) >= 0]
        if all(bounds(d, ranges)[0] > 1 for d in dims):
            groups.append((f"dim {k}", dims))
    return groups


def _shipped_widths(g_proto: onnx.GraphProto, graph: Graph) -> tuple[np.dtype, ...]:
    """The narrow dtypes the model ships weights in behind a Cast or a DequantizeLinear
    (compiler/ir/narrow.py)."""
    first_inputs = ((n.op_type, n.input[0] if n.input else "") for n in g_proto.node)
    arrays = {name: v.const for name, v in graph.constants.items() if v.const is not None}
    return shipped_widths(first_inputs, arrays)


def _fold_into(graph: Graph, env: dict[str, Value], arrays: dict[str, np.ndarray], name: str,
               dtypes: Mapping[str, np.dtype] | None = None) -> None:
    """The folded ONNX node ``name``'s results become constants of those names (a symbolic one, an
    object array, keeps its output's dtype from ``dtypes``)."""
    for value_name, array in arrays.items():
        dtype = (dtypes or {}).get(value_name) if array.dtype == object else None
        const = Value(value_name, dtype, const=array)
        graph.constants[value_name] = const
        graph.reserve_name(value_name)
        env[value_name] = const
    graph.eliminated[name] = "folded at import"


def _note_control_flow(knowledge: Knowledge, env: dict[str, Value], proto: onnx.NodeProto, name: str) -> None:
    """Record what the outputs of control-flow node ``proto`` that are not constants depend on (its
    inputs and the outer values its subgraphs read, those not known), so that errors walk past it."""
    outer = sorted({n for sub in subgraphs(proto) for n in outer_names(sub)})
    reads = [n for n in (*proto.input, *outer) if n]
    unknown = tuple(dict.fromkeys(env[n].name for n in reads if n in env and env[n].const is None))
    outputs = [env[n].name for n in proto.output if n in env and env[n].const is None]
    knowledge.stays(Producer(name, proto.op_type, unknown, "a control-flow step computes it at run time"),
                    outputs)


def _constant(graph: Graph, proto: onnx.NodeProto, where: str) -> Value:
    attrs = onnx_attrs(proto)
    if "value" in attrs:
        array = np.asarray(attrs["value"])
    elif "value_float" in attrs:
        array = np.array(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        array = np.array(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        array = np.array(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        array = np.array(attrs["value_ints"], np.int64)
    else:
        raise ModelError(f"{where}: only tensor, float(s) and int(s) constants are supported")
    value = Value(proto.output[0], const=np.ascontiguousarray(array).reshape(array.shape))
    graph.constants[value.name] = value
    graph.reserve_name(value.name)
    return value


def _output_values(proto: onnx.NodeProto, inputs: list[Value | None], types: dict[str, onnx.TypeProto],
                   where: str, opset: int, used: frozenset[str], knowledge: Knowledge,
                   sampled: Mapping[str, list[np.ndarray]]) -> list[Value]:
    """The node's outputs with dtypes and shapes: onnx's whole-model inference, else the node
    inferred alone from what is known of its inputs (see folding.py for why that suffices), else
    the shape its ``sampled`` results (``_propagate_samples``) all have."""
    outputs: list[Value] = []
    fallback: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
    for name in proto.output:
        if not name:
            outputs.append(Value(f"{proto.name}/unused_{len(outputs)}", np.dtype(np.float32), ()))
            continue
        try:
            dtype, shape = _static_type(types, name, f"output {name!r} of {where}", knowledge.symbols)
        except ShapeError:
            shapes = {(a.dtype, a.shape) for a in sampled.get(name, ())}
            if len(shapes) == 1:
                outputs.append(Value(name, *shapes.pop()))
                continue
            if fallback is None:
                probes = knowledge.probes
                fallback = (qoperator_types(proto, inputs) or qgemm_types(proto, inputs)  # com.microsoft ops
                            or qlstm_types(proto, inputs))
                symbolic = any(v is not None and v.is_symbolic for v in inputs)
                if not fallback and probes is not None and symbolic:
                    fallback = _infer_symbolic(proto, inputs, opset, probes, where, knowledge.input_shapes)
                elif not fallback:
                    fallback = _infer_single(proto, inputs, opset)
            if name not in fallback and name not in used:
                # e.g. Dropout-7's mask, which onnx does not infer: canonical forms drop unused extra
                # outputs, and the verifier rejects a shapeless value that would stay
                outputs.append(Value(name))
                continue
            if name not in fallback:
                raise _unknown_shape(proto, inputs, name, where, knowledge, opset) from None
            dtype, shape = fallback[name]
        outputs.append(Value(name, dtype, shape))
    return outputs


def _unknown_shape(proto: onnx.NodeProto, inputs: list[Value | None], output: str, where: str,
                   knowledge: Knowledge, opset: int) -> ShapeError:
    """Output ``output`` has no static shape: name the inputs not known at compile time whose values
    it depends on, the graph inputs they come from and what to do."""
    listed = COMPILE_TIME_INPUTS.get(proto.op_type) if proto.domain in ("", "ai.onnx") else None
    unknown = [(i, v) for i, v in enumerate(inputs)
               if v is not None and v.const is None and (listed is None or i in listed)]
    message = f"{where}: cannot infer a static shape for output {output!r}"
    probed = inputs
    if knowledge.probes is not None and any(v is not None and v.is_symbolic for v in inputs):
        at = knowledge.probes.varied[0]  # (every symbol at its LO: what onnx says there)
        probed = [_at_binding(v, at) for v in inputs]
        message += f" at any probe size of the symbols (at {', '.join(f'{k}={n}' for k, n in at.items())})"
    rejected = _inference_error(proto, probed, opset)
    if rejected is not None:
        shapes = ", ".join("x".join(map(str, v.shape)) if v is not None and v.shape is not None else "-"
                           for v in inputs)
        return ShapeError(f"{message}: its input shapes ({shapes}) do not fit the op: {rejected}; check "
                          f"the --shape sizes (a model may work only at some input sizes)")
    if not unknown:
        return ShapeError(f"{message} (onnx's shape inference gives none from what is known of its inputs)")
    i, value = unknown[0]
    unknown_input = f"input {i} ({value.name!r})"
    if listed is not None:
        unknown_input = f"it depends on the value of {unknown_input}, which"
    why = knowledge.explain(value.name)
    return ShapeError(f"{message}: {unknown_input} is not known at compile time: {why}")


def _infer_single(proto: onnx.NodeProto, inputs: list[Value | None],
                  opset: int) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Shape-infer one node alone (in the model's opset), its constant inputs given as initializers."""
    model = _single_node_model(proto, inputs, opset)
    try:
        inferred = infer_with_pool_sizes(model, _infer_plain)
    except Exception:
        return {}
    result: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    types = _type_table(inferred.graph)
    for name in proto.output:
        try:
            result[name] = _static_type(types, name, name)
        except (ShapeError, ModelError):
            pass
    return result


def _propagate_samples(proto: onnx.NodeProto, inputs: list[Value | None], knowledge: Knowledge,
                       opset: int) -> dict[str, list[np.ndarray]]:
    """The results of ``proto`` at each sample (``Knowledge.samples``: sample values of run-time
    values, a loop step's iteration number) where it reads sampled values and otherwise constants
    only (onnx's reference evaluator); {} elsewhere, or where a sample fails."""
    found = [knowledge.samples.get(id(v)) if v is not None else None for v in inputs]
    if not any(found) or any(v is not None and f is None and (v.const is None or v.const.dtype == object)
                             for v, f in zip(inputs, found, strict=True)):
        return {}
    from onnx.reference import ReferenceEvaluator

    count = min(len(f[1]) for f in found if f is not None)
    results: list[list[np.ndarray]] = []
    for j in range(count):
        at = [Value(v.name, v.dtype, const=f[1][j]) if f is not None and v is not None else v
              for v, f in zip(inputs, found, strict=True)]
        try:
            run = ReferenceEvaluator(_single_node_model(proto, at, opset)).run(None, {})
            results.append([np.asarray(r) for r in run])
        except Exception:  # (a sample the node cannot take: no shape from the samples)
            return {}
    names = [n for n in proto.output if n]
    return {name: [r[k] for r in results] for k, name in enumerate(names)}


def _single_node_model(proto: onnx.NodeProto, inputs: list[Value | None], opset: int,
                       max_const: int | None = None) -> onnx.ModelProto:
    """``proto`` alone in a model, its inputs typed as known and its constant ones initializers
    (with ``max_const``, only those of at most that many elements: weights only need their type)."""
    value_infos, inits = [], []
    for onnx_name, value in zip(proto.input, inputs, strict=True):  # (a value may be named apart:
        if value is None:                                            # an If's output is its branch's)
            continue
        if value.const is not None and (max_const is None or value.const.size <= max_const):
            inits.append(numpy_helper.from_array(value.const, onnx_name))
        assert value.dtype is not None
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        value_infos.append(helper.make_tensor_value_info(onnx_name, elem, value.shape))
    outs = [helper.make_empty_tensor_value_info(n) for n in proto.output if n]
    graph = helper.make_graph([proto], "single", value_infos, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _infer_symbolic(proto: onnx.NodeProto, inputs: list[Value | None], opset: int, probes: Probes,
                    where: str, input_shapes: Mapping[str, Sequence[Any]]
                    ) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Shape-infer one node whose inputs have symbolic dims or values: onnx's inference of the node
    alone at the probe bindings, each output dim fitted as an expression of the input's symbolic
    dims and values (``probing.py``); a dim that fits none is a ShapeError naming it. A Conv or
    pool over symbolic spatial dims takes its size rule instead (``window_ranges.py``), checked
    against onnx's inference at the probes."""
    atoms = atoms_of(*(v.shape for v in inputs if v is not None and v.shape is not None),
                     *(list(v.const.reshape(-1)) for v in inputs if v is not None and v.const is not None
                       and v.const.dtype == object))

    def at(binding: dict[str, int]) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
        concrete = [_at_binding(v, binding) for v in inputs]
        model = _single_node_model(proto, concrete, opset, max_const=4096)
        inferred = infer_with_pool_sizes(model, _infer_strict)
        types = _type_table(inferred.graph)
        result = {}
        for name in proto.output:
            if name and name in types:
                try:
                    result[name] = _static_type(types, name, name)
                except (ShapeError, ModelError):
                    pass
        return result or None

    same = same_shape(proto, inputs)
    if same is not None:
        one = _first_success(at, probes)
        names = [n for n in proto.output if n]
        if one is not None and names[0] in one[1] and one[1][names[0]][1] == concrete_shape(same, one[0]):
            return {names[0]: (one[1][names[0]][0], same)}  # type: ignore[dict-item]  # (symbolic dims)
    found = probes.run(at)
    sliced = slice_shape(proto, inputs, opset, probes.ranges)
    seen_out = [(b, types[proto.output[0]]) for b, types in found if proto.output[0] in types]
    if sliced is not None and seen_out and all(t[1] == concrete_shape(sliced, b) for b, t in seen_out):
        return {proto.output[0]: (seen_out[0][1][0], sliced)}  # type: ignore[dict-item]  # (symbolic dims)
    windowed = window_rule(proto, inputs, found, where, probes.ranges, input_shapes)
    if windowed is not None:
        return windowed  # type: ignore[return-value]  # (symbolic dims: see ir.graph.Shape)
    return _fit_outputs(proto, inputs, opset, probes, where, found, atoms)


def _fit_outputs(proto: onnx.NodeProto, inputs: list[Value | None], opset: int, probes: Probes, where: str,
                 found: list[tuple[dict[str, int], OutputTypes]], atoms: Sequence[Expr]
                 ) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Each output's dims fitted as expressions of ``atoms`` to onnx's inference at the probe
    bindings (``found``), the fits then checked at more bindings (``verify_fits``); an output whose
    dtype or rank varies across the probes is left out, a dim that fits none is a ShapeError."""
    cache: dict[tuple[tuple[str, int], ...], OutputTypes | None] = {}

    def many(bindings: list[dict[str, int]]) -> list[OutputTypes | None]:
        todo = [b for b in bindings if tuple(sorted(b.items())) not in cache]
        for b, types in zip(todo, infer_many(proto, inputs, opset, todo), strict=True):
            cache[tuple(sorted(b.items()))] = types
        return [cache[tuple(sorted(b.items()))] for b in bindings]

    result: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for name in proto.output:
        seen = [(binding, types[name]) for binding, types in found if name in types]
        if not seen or len({(t[0], len(t[1])) for _, t in seen}) != 1:
            continue
        dims = []
        for k in range(len(seen[0][1][1])):
            dim = fit([t[1][k] for _, t in seen], atoms, [b for b, _ in seen])
            if dim is None:
                raise ShapeError(f"{where}: output {name!r} dim {k} is no expression of the symbols this "
                                 f"import can fit (from its inputs' dims {', '.join(map(str, atoms))}; the "
                                 f"node takes {len(seen)} of {probes.count} probe sizes: check the ranges); "
                                 f"dynamic shapes: docs/dynamic-shapes.md")
            dims.append(dim)

        def truth(bindings: list[dict[str, int]], name: str = name) -> list[list[int] | None]:
            return [None if t is None or name not in t else list(t[name][1]) for t in many(bindings)]

        labels = [f"output {name!r} dim {k}" for k in range(len(dims))]
        points = [(b, list(t[1])) for b, t in seen]
        dims = verify_fits(where, labels, dims, points, atoms, truth, probes.ranges)
        result[name] = (seen[0][1][0], tuple(dims))  # type: ignore[arg-type]  # (symbolic dims: see ir.graph.Shape)
    return result


def _first_success(at: Any, probes: Probes) -> tuple[dict[str, int], dict[str, Any]] | None:
    """The first probe binding (varied, then aligned) at which ``at`` succeeds, with its result."""
    for binding in [*probes.varied, *probes.aligned]:
        try:
            result = at(binding)
        except Exception:  # (a size the node refuses)
            continue
        if result is not None:
            return binding, result
    return None


def _at_binding(value: Value | None, binding: dict[str, int]) -> Value | None:
    """``value`` with its symbolic dims and symbolic constant taken at ``binding``."""
    if value is None or not value.is_symbolic:
        return value
    if value.const is not None:
        flat = [sym_evaluate(d, binding) for d in value.const.reshape(-1)]
        return Value(value.name, const=np.array(flat, dtype=value.dtype).reshape(value.const.shape))
    assert value.shape is not None
    return Value(value.name, value.dtype, concrete_shape(value.shape, binding))


@contextlib.contextmanager
def _symbolic_guard(where: str, what: str, values: Sequence[Value | None]) -> Iterator[None]:
    """A step that cannot take symbolic dims yet fails (TypeError and the like, from comparing or
    converting an expression) with a ShapeError naming the node and the symbolic dims it met."""
    try:
        yield
    except (TypeError, ValueError, ArithmeticError, AssertionError, IndexError) as exc:
        met = [f"{v.name!r} {_shape_text(v)}" for v in values if v is not None and v.is_symbolic]
        if not met:
            raise
        raise ShapeError(f"{where}: {what} cannot take symbolic dims yet (dynamic shapes are imported "
                         f"for part of the ops, docs/dynamic-shapes.md); it met {'; '.join(met)} "
                         f"({type(exc).__name__}: {exc})") from None


def _shape_text(value: Value) -> str:
    if value.const is not None and value.const.dtype == object:
        return "value [" + ", ".join(str(d) for d in value.const.reshape(-1)) + "]"
    return "shape [" + ", ".join(str(d) for d in value.shape or ()) + "]"


def _inference_error(proto: onnx.NodeProto, inputs: list[Value | None], opset: int) -> str | None:
    """What onnx's strict shape inference says against this node's known input shapes, if anything
    (e.g. a Concat of inputs that differ off its axis)."""
    if any(v is not None and v.shape is None for v in inputs):
        return None
    try:
        onnx.shape_inference.infer_shapes(_single_node_model(proto, inputs, opset), strict_mode=True)
    except Exception as exc:
        text = str(exc).strip().splitlines()  # onnx nests its reasons: keep the innermost one
        return text[0].rsplit("[ShapeInferenceError]", 1)[-1].strip() if text else type(exc).__name__
    return None


def _infer_plain(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _infer_strict(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
