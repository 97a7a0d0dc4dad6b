"""Out-of-range indices are an error (issue 29 item 5): Gather, GatherElements, GatherND,
ScatterElements and ScatterND with an index outside ``[-n, n)`` raise ``IndexRangeError`` (an
``InputError``) naming the node, the first offending value and the axis size -- on the C provider
and on the reference provider, at static shapes and compiled with a range -- where onnxruntime
refuses them too; negative indices in range still match onnxruntime.

Each case is one node in the form exporters write it (an embedding table as an initializer, the
token ids an input); the C Gather is the checked kernel (``templates/c/gather.c.j2``), the others
run on the reference kernels whatever the providers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper

from compiler.driver import compile_model
from compiler.providers.base import Provider
from compiler.providers.reference import ReferenceProvider
from runtime.errors import IndexRangeError
from runtime.errors import InputError
from runtime.session import Session
from tests.support.models import ort_run

I64, F32 = TensorProto.INT64, TensorProto.FLOAT
CPU = "x86-64-v3"  # the C text checked below is this target's


@dataclass(frozen=True)
class Case:
    """One node: ``inputs`` (name, dtype, static shape, dynamic shape), ``good`` feeds with negative
    indices in range, ``bad`` ones whose first offending index is ``fault`` (value, axis, size)."""

    op: str
    attrs: dict
    inputs: tuple[tuple[str, int, list, list], ...]
    out: tuple[int, list, list]
    inits: tuple[tuple[str, np.ndarray], ...]
    dims: dict[str, tuple[int, int]]
    good: dict[str, np.ndarray]
    bad: dict[str, np.ndarray]
    fault: tuple[int, int, int]

    def model(self, dynamic: bool) -> onnx.ModelProto:
        names = [name for name, *_ in self.inputs]
        node = helper.make_node(self.op, [n for n, _ in self.inits] + names, ["y"], name="the_node",
                                **self.attrs)
        ins = [helper.make_tensor_value_info(n, t, d if dynamic else s) for n, t, s, d in self.inputs]
        t, s, d = self.out
        graph = helper.make_graph([node], "index_bounds", ins,
                                  [helper.make_tensor_value_info("y", t, d if dynamic else s)],
                                  initializer=[onnx.numpy_helper.from_array(a, n) for n, a in self.inits])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


_TABLE = (np.arange(40, dtype=np.float32).reshape(10, 4) / 3).astype(np.float32)
_X = _rng(1).standard_normal((3, 5)).astype(np.float32)
_D3 = _rng(2).standard_normal((3, 4, 5)).astype(np.float32)
_D43 = _rng(3).standard_normal((4, 3)).astype(np.float32)
_UPD2 = _rng(4).standard_normal((3, 2)).astype(np.float32)
_UPD3 = _rng(5).standard_normal((2, 3)).astype(np.float32)

CASES = {
    # an embedding lookup: table (10, 4) by ids (b, s); the first bad id in order is 10, not -11
    "Gather_embedding": Case(
        "Gather", {"axis": 0}, (("ids", I64, [2, 3], ["b", "s"]),), (F32, [2, 3, 4], ["b", "s", 4]),
        (("table", _TABLE),), {"b": (1, 4), "s": (1, 64)},
        {"ids": np.array([[1, -1, 3], [-10, 9, 0]], np.int64)},
        {"ids": np.array([[1, -1, 3], [10, 5, -11]], np.int64)}, (10, 0, 10)),
    # a gather along a run-time axis (its size a run-time dim in the C kernel), rows before it
    "Gather_axis1": Case(
        "Gather", {"axis": 1}, (("x", F32, [3, 5], [3, "n"]), ("pick", TensorProto.INT32, [4], [4])),
        (F32, [3, 4], [3, 4]), (), {"n": (2, 20)},
        {"x": _X, "pick": np.array([4, -5, 0, -1], np.int32)},
        {"x": _X, "pick": np.array([0, -6, 5, 9], np.int32)}, (-6, 1, 5)),
    "GatherElements": Case(
        "GatherElements", {"axis": 1}, (("x", F32, [3, 5], ["b", 5]), ("i", I64, [3, 2], ["b", 2])),
        (F32, [3, 2], ["b", 2]), (), {"b": (1, 8)},
        {"x": _X, "i": np.array([[0, -1], [4, -5], [2, 3]], np.int64)},
        {"x": _X, "i": np.array([[0, -1], [4, 5], [-6, 3]], np.int64)}, (5, 1, 5)),
    "GatherND": Case(
        "GatherND", {}, (("i", I64, [3, 2], ["m", 2]),), (F32, [3, 5], ["m", 5]), (("data", _D3),),
        {"m": (1, 16)},
        {"i": np.array([[0, -1], [-3, 3], [2, -4]], np.int64)},
        {"i": np.array([[0, -1], [1, -5], [3, 0]], np.int64)}, (-5, 1, 4)),
    "ScatterElements": Case(
        "ScatterElements", {"axis": 1},
        (("x", F32, [3, 5], ["b", 5]), ("i", I64, [3, 2], ["b", 2]), ("u", F32, [3, 2], ["b", 2])),
        (F32, [3, 5], ["b", 5]), (), {"b": (1, 8)},
        {"x": _X, "i": np.array([[0, -1], [4, -5], [2, 3]], np.int64), "u": _UPD2},
        {"x": _X, "i": np.array([[0, -1], [7, 1], [2, 3]], np.int64), "u": _UPD2}, (7, 1, 5)),
    "ScatterND": Case(
        "ScatterND", {}, (("i", I64, [2, 1], ["m", 1]), ("u", F32, [2, 3], ["m", 3])),
        (F32, [4, 3], [4, 3]), (("data", _D43),), {"m": (1, 4)},
        {"i": np.array([[-1], [1]], np.int64), "u": _UPD3},
        {"i": np.array([[2], [-5]], np.int64), "u": _UPD3}, (-5, 0, 4)),
}


def _compile(case: Case, dynamic: bool, reference: bool, out: Path) -> Path:
    providers: list[Provider] | None = [ReferenceProvider()] if reference else None
    return compile_model(case.model(dynamic), out, dims=case.dims if dynamic else None,
                         providers=providers, cpu=CPU)


def _provider_of(out: Path, op: str) -> str:
    (provider,) = {s["provider"] for s in json.loads((out / "plan.json").read_text())["steps"]
                   if s["op_type"] == op}
    return str(provider)


def _fault_message(op: str, fault: tuple[int, int, int], name: str = "the_node") -> str:
    value, axis, size = fault
    return (rf"^node '{name}' \({op}\): index {value} is out of range for axis {axis} of size {size} "
            rf"\(valid: {-size}\.\.{size - 1}\)$")


@pytest.mark.parametrize("provider", ["c", "reference"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "range"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_out_of_range_index_is_an_input_error_naming_node_value_and_size(
        name: str, dynamic: bool, provider: str, tmp_path: Path) -> None:
    case = CASES[name]
    out = _compile(case, dynamic, provider == "reference", tmp_path / "a")
    want_provider = "c" if case.op == "Gather" and provider == "c" else "reference"
    assert _provider_of(out, case.op) == want_provider
    session = Session(out, threads=2)
    model = case.model(dynamic)
    for got, want in zip(session.run(None, case.good), ort_run(model, case.good), strict=True):
        np.testing.assert_array_equal(got, want)  # negative indices in range: as onnxruntime
    with pytest.raises(InputError, match=_fault_message(case.op, case.fault)) as caught:
        session.run(None, case.bad)
    assert isinstance(caught.value, IndexRangeError)
    assert (caught.value.value, caught.value.axis, caught.value.size) == case.fault
    with pytest.raises(Exception):  # noqa: B017 -- onnxruntime refuses the same feed (any type)
        ort_run(model, case.bad)
    for got, want in zip(session.run(None, case.good), ort_run(model, case.good), strict=True):
        np.testing.assert_array_equal(got, want)  # the session still runs after the error


def _embedding_model(vocab: int, hidden: int, seq: int) -> onnx.ModelProto:
    """BERT's word embedding (vocab x hidden, an initializer) gathered by input_ids (1, seq),
    then an Add of the position embedding as exporters write it, and a second Gather (token
    types, 2 x hidden) so the first fault's step is not the partition's first step."""
    rng = _rng(7)
    words = rng.standard_normal((vocab, hidden)).astype(np.float32)
    positions = rng.standard_normal((1, seq, hidden)).astype(np.float32)
    types = rng.standard_normal((2, hidden)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["types", "token_type_ids"], ["t"], name="/embeddings/token_type"),
             helper.make_node("Gather", ["words", "input_ids"], ["w"], name="/embeddings/word_embeddings"),
             helper.make_node("Add", ["w", "positions"], ["wp"], name="/embeddings/add_pos"),
             helper.make_node("Add", ["wp", "t"], ["emb"], name="/embeddings/add_type")]
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in (("words", words), ("positions", positions),
                                                              ("types", types))]
    graph = helper.make_graph(
        nodes, "embeddings",
        [helper.make_tensor_value_info("input_ids", I64, [1, seq]),
         helper.make_tensor_value_info("token_type_ids", I64, [1, seq])],
        [helper.make_tensor_value_info("emb", F32, [1, seq, hidden])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_minilm_size_embedding_gather_matches_and_names_a_token_outside_the_vocabulary(
        tmp_path: Path) -> None:
    vocab, hidden, seq = 30522, 384, 128
    model = _embedding_model(vocab, hidden, seq)
    out = compile_model(model, tmp_path / "a", cpu=CPU)
    assert _provider_of(out, "Gather") == "c"
    session = Session(out, threads=2)
    ids = _rng(8).integers(-vocab, vocab, (1, seq)).astype(np.int64)
    ids[0, :3] = [0, vocab - 1, -vocab]
    feeds = {"input_ids": ids, "token_type_ids": (np.arange(seq) % 2).reshape(1, seq).astype(np.int64)}
    (got,) = session.run(None, feeds)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=0, atol=1e-6)
    bad = ids.copy()
    bad[0, [40, 90]] = [vocab + 7, vocab]  # (a tokenizer with a larger vocabulary)
    with pytest.raises(InputError, match=_fault_message("Gather", (vocab + 7, 0, vocab),
                                                        "/embeddings/word_embeddings")):
        session.run(None, {**feeds, "input_ids": bad})
    types = feeds["token_type_ids"].copy()
    types[0, 5] = 2
    with pytest.raises(InputError, match=_fault_message("Gather", (2, 0, 2), "/embeddings/token_type")):
        session.run(None, {**feeds, "token_type_ids": types})


def test_the_c_gather_checks_every_index_before_it_copies(tmp_path: Path) -> None:
    """The checked kernel's text (--cpu x86-64-v3): the range check is one pass over the indices
    before the copy (its pool part, defined ahead of the kernel), which neither branches on the
    range nor writes zeros."""
    out = _compile(CASES["Gather_embedding"], False, False, tmp_path / "a")
    source = (out / "kernels" / "cpu" / "model.c").read_text()
    start = source.index("\nint k_")
    body = source[start:source.index("\n}\n", start)]
    name = body[len("\nint "):body.index("(")]
    part_at = source.index(f"void {name}_copy(")
    part = source[part_at:source.index("\n}\n", part_at)]
    check = body.index("bad |= (uint64_t)ind[k] + n >= span;")
    assert check < body.index("return 1;") < body.index(f"{name}_copy")
    assert "memcpy(" in part and "span" not in part
    assert "memset" not in body and "memset" not in part
    assert "return onnx_aot_fail(0, fault);" in source  # the entry reports the step that faulted


def _loop_model() -> onnx.ModelProto:
    """acc += table[i] for i in range(M), M a run-time trip count: the body's Gather reads row i,
    so M > 3 runs past the table's 3 rows."""
    table = helper.make_node("Constant", [], ["table"], value=onnx.numpy_helper.from_array(_TABLE[:3], "t"))
    body = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["row"], name="body_gather", axis=0),
         helper.make_node("Add", ["acc", "row"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F32, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, [4])])
    nodes = [table, helper.make_node("Loop", ["M", "", "acc0"], ["acc"], name="the_loop", body=body)]
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("M", I64, []),
                                              helper.make_tensor_value_info("acc0", F32, [4])],
                              [helper.make_tensor_value_info("acc", F32, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_an_index_fault_in_a_compiled_loop_body_names_the_body_node(tmp_path: Path) -> None:
    model = _loop_model()
    session = Session(compile_model(model, tmp_path / "a", cpu=CPU))
    (loop,) = [s for s in session.plan.steps if s.op_type == "Loop"]
    assert loop.schedules is not None  # compiled control: the body's Gather is a C step
    assert [s.provider for b in loop.schedules for s in b.steps if s.op_type == "Gather"] == ["c"]
    feeds: dict[str, np.ndarray] = {"M": np.array(3, np.int64), "acc0": np.zeros(4, np.float32)}
    np.testing.assert_array_equal(session.run(None, feeds)[0], ort_run(model, feeds)[0])
    with pytest.raises(InputError, match=_fault_message("Gather", (3, 0, 3), "the_loop/body/body_gather")):
        session.run(None, {**feeds, "M": np.array(5, np.int64)})
