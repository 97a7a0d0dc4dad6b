"""onnxruntime's ``quantize_dynamic`` applied to an LSTM (com.microsoft.DynamicQuantizeLSTM):
imported as ``onnx_aot.QLSTM`` (compiler/frontend/canonical/quantize_lstm.py) and run as
onnxruntime runs it, by the reference kernel (runtime/kernels/qrecurrent.py) and the C int8 LSTM
(compiler/providers/c/qlstm.py: every int8 path, 1 and 2 threads, run-time seq / batch, weights
packed at compile time or at run time).

The oracle is onnxruntime on one intra-op thread (on more it splits the batch and quantizes each
part's H apart, so its own result depends on its thread count). The integers are exact on both
sides; what is left is float32 rounding in the scaling, the bias adds and the activations (MLAS's
logistic / tanh approximations against numpy's and our vector math), so outputs agree to 1e-6
absolute (measured: at most 1.2e-7 on |outputs| < 1) — a rounding step of X's or H's scale
(~1e-2) would show as ~1e-3.
Over longer runs one value of H may round to the neighbouring level in one engine only (FLIP_ATOL).
Against the fp32 model each output strays at most 1.25x as far as onnxruntime's int8 run + 0.005.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantType
from onnxruntime.quantization import quantize_dynamic

from compiler import compile_model
from compiler.providers.base import Provider
from compiler.providers.reference import ReferenceProvider
from runtime import Session
from runtime.errors import ModelError
from scripts.fetch_models import model_named
from tests.support.fetched import fetched_model
from tests.support.lstm_models import lstm_feeds
from tests.support.lstm_models import lstm_model
from tests.support.lstm_models import quantized_lstm
from tests.support.real_models import feeds_for
from tests.test_qgemm import TARGETS as QGEMM_TARGETS
from tests.test_qgemm import _runs as qgemm_target_runs

ATOL = 1e-6  # float32 rounding only (see the module docstring)
# Over more steps a value of H can land on the other side of a quantization level in one engine
# and not the other (their logistic / tanh differ in the last bits): that value moves by one step of
# H's scale (~1/128 of its range), each gate by about that times |R| (~0.1), ~1e-3 at most, and the
# difference then decays through the cell (measured: 1.6e-4 over 12 steps, 6.7e-4 over 50).
FLIP_ATOL = 2e-3


class _Ort:
    """onnxruntime on one intra-op thread, each result from a session's second run. Seen with
    onnxruntime 1.32 and partial sequence_lens: the first run of a DynamicQuantizeLSTM session
    created after an x86-64-v2 (portable) onnx-aot build of the same LSTM had run in this process
    (and after an earlier onnxruntime session was freed) strays by up to ~0.6 from that session's
    own later runs and from a first run in a fresh process, which all agree with this kernel; it
    looks like onnxruntime reading memory it did not write (AddressSanitizer finds nothing in our
    build; numpy or stack garbage alone does not reproduce it)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(model.SerializeToString(), options)

    def run(self, _: None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.session.run(None, feeds)
        return list(self.session.run(None, feeds))


def _ort(model: onnx.ModelProto) -> _Ort:
    return _Ort(model)


def _stray(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def _providers(artifact: Path) -> list[tuple[str, str]]:
    return [(s["op_type"], s["provider"]) for s in json.loads((artifact / "plan.json").read_text())["steps"]]


def _source(artifact: Path) -> str:
    return (artifact / "kernels" / "cpu" / "model.c").read_text()


@pytest.mark.parametrize("provider", ["c", "reference"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_quantize_dynamic_lstm_matches_onnxruntime(tmp_path: Path, bidirectional: bool, per_channel: bool,
                                                   provider: str) -> None:
    """The C kernel (this host's default --cpu level) and the reference kernel alike."""
    fp = lstm_model(7, 3, 10, 24, bidirectional=bidirectional)
    q = quantized_lstm(fp, tmp_path, per_channel=per_channel)
    assert [n.op_type for n in q.graph.node if n.domain == "com.microsoft"] == ["DynamicQuantizeLSTM"]
    assert not any(n.op_type == "LSTM" for n in q.graph.node)
    only: list[Provider] | None = [ReferenceProvider()] if provider == "reference" else None
    artifact = compile_model(q, tmp_path / "a", golden_cases=1, providers=only)
    assert ("QLSTM", provider) in _providers(artifact)
    ours, theirs, exact = Session(artifact), _ort(q), _ort(fp)
    for seed in range(3):
        feeds = lstm_feeds(fp, seed)
        want, ref = theirs.run(None, feeds), exact.run(None, feeds)
        for i, (got, w, r) in enumerate(zip(ours.run(None, feeds), want, ref, strict=True)):
            assert np.abs(got - w).max() <= ATOL, (seed, i)
            assert _stray(got, r) <= 1.25 * _stray(w, r) + 0.005, (seed, i)


@pytest.mark.parametrize("with_y", [True, False], ids=["y_used", "y_unused"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
def test_sequence_lengths_quantize_h_as_onnxruntime_does(tmp_path: Path, with_y: bool,
                                                         bidirectional: bool) -> None:
    """Entries of lengths 6, 5, 4, 3: past its length an entry's row of H is its last state when Y
    is not produced, and zeros from the second step on when it is (``zero_finished``); either way
    the rows take part in the range the step's H is quantized over."""
    fp = lstm_model(6, 4, 9, 20, bidirectional=bidirectional, lengths=True, with_y=with_y, seed=3)
    q = quantized_lstm(fp, tmp_path, per_channel=True)
    artifact = compile_model(q, tmp_path / "a", golden_cases=1)
    ours, theirs = Session(artifact), _ort(q)
    for seed in range(2):
        feeds = lstm_feeds(fp, seed)
        assert list(feeds["lens"]) == [6, 5, 4, 3]
        for i, (got, w) in enumerate(zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True)):
            assert np.abs(got - w).max() <= ATOL, (seed, i)


def test_zero_finished_changes_the_result(tmp_path: Path) -> None:
    """The flag is not decoration: the same weights and feeds with Y used and unused give different
    final states (in both onnxruntime and our kernel)."""
    states = []
    for with_y in (True, False):
        fp = lstm_model(6, 4, 9, 20, lengths=True, with_y=with_y, seed=3)
        q = quantized_lstm(fp, tmp_path, per_channel=False)
        artifact = compile_model(q, tmp_path / f"a{with_y}", golden_cases=1)
        feeds = lstm_feeds(fp, 0)
        got, want = Session(artifact).run(None, feeds)[-2:], _ort(q).run(None, feeds)[-2:]
        assert all(np.abs(g - w).max() <= ATOL for g, w in zip(got, want, strict=True))
        states.append(got[0])
    assert np.abs(states[0] - states[1]).max() > 1e-5


def _edit(model: onnx.ModelProto, **attrs: object) -> onnx.ModelProto:
    node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")
    node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attrs.items())
    return model


def test_layout_1_and_nonzero_int8_channel_zero_points_are_refused(tmp_path: Path) -> None:
    fp = lstm_model(3, 2, 5, 8)
    q = quantized_lstm(fp, tmp_path, per_channel=True)
    with pytest.raises(ModelError, match=r"DynamicQuantizeLSTM.*layout must be 0"):
        compile_model(_edit(onnx.ModelProto.FromString(q.SerializeToString()), layout=1), tmp_path / "a",
                      golden_cases=0)
    bad = onnx.ModelProto.FromString(q.SerializeToString())
    zero = next(t for t in bad.graph.initializer if t.name.endswith("W_zero_point"))
    values = onnx.numpy_helper.to_array(zero).copy()
    values[0, 3] = 1
    zero.CopyFrom(onnx.numpy_helper.from_array(values, zero.name))
    with pytest.raises(ModelError, match="W_zero_point must be all zero"):
        compile_model(bad, tmp_path / "b", golden_cases=0)


# The int8 tile's paths, as the integer GEMM's tests name them: target -> (how to build it, the text
# its tile must contain, what it must not), and whether this host runs the target's code.
TARGETS = QGEMM_TARGETS


@pytest.fixture(scope="module")
def wide_lstm(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Large enough for the pool to split the projections, the steps' products, the cell updates
    and the packing (hidden 152: 608 gate columns, 38 panels: a tail group on the 4-panel tile);
    lengths 9 down to 3."""
    fp = lstm_model(9, 7, 40, 152, bidirectional=True, lengths=True, seed=5)
    return fp, quantized_lstm(fp, tmp_path_factory.mktemp("wide"), per_channel=True)


@pytest.mark.parametrize("target", list(TARGETS))
def test_c_kernel_on_every_int8_path_matches_at_any_thread_count(
        tmp_path: Path, wide_lstm: tuple[onnx.ModelProto, onnx.ModelProto], target: str) -> None:
    fp, q = wide_lstm
    how, has, lacks = TARGETS[target]
    artifact = compile_model(q, tmp_path / "a", golden_cases=1, **how)  # type: ignore[arg-type]
    assert ("QLSTM", "c") in _providers(artifact)
    text = _source(artifact)
    assert has in text and lacks not in text, target
    for part in ("htiles", "xtiles", "cells"):  # on the pool
        assert f"_{part}_task, (void*)&args" in text, part
    assert ('__builtin_cpu_supports("avx512vnni")' in text) == (target == "x86-64-v4")
    if not qgemm_target_runs(target):
        pytest.skip(f"this host does not run {target} code (the text was checked)")
    feeds = lstm_feeds(fp, 1)
    want = _ort(q).run(None, feeds)
    one = Session(artifact, threads=1).run(None, feeds)
    two = Session(artifact, threads=2).run(None, feeds)
    for i, (a, b, w) in enumerate(zip(one, two, want, strict=True)):
        assert np.array_equal(a, b), (target, i)
        assert np.abs(a - w).max() <= ATOL, (target, i)


def test_weights_packed_at_compile_time_or_at_run_time_give_the_same_outputs(
        tmp_path: Path, wide_lstm: tuple[onnx.ModelProto, onnx.ModelProto]) -> None:
    """From level 2 pack_qlstm_weights stores W and R in the tile's panels (packed 1: no packing
    part in the kernel); at level 1 the kernel packs them into scratch at every run."""
    fp, q = wide_lstm
    feeds = lstm_feeds(fp, 2)
    results = []
    for level, packs_at_run_time in ((1, True), (3, False)):
        artifact = compile_model(q, tmp_path / f"l{level}", golden_cases=1, opt_level=level, cpu="x86-64-v3")
        plan = json.loads((artifact / "plan.json").read_text())
        step = next(s for s in plan["steps"] if s["op_type"] == "QLSTM")
        assert step["provider"] == "c" and len(step["inputs"]) == (12 if packs_at_run_time else 14)
        assert ("_packb(" in _source(artifact)) == packs_at_run_time
        results.append(Session(artifact, threads=2).run(None, feeds))
    for a, b in zip(*results, strict=True):
        assert np.array_equal(a, b)


def test_run_time_sequence_length_and_batch_run_on_the_c_kernel(tmp_path: Path) -> None:
    """An export with dynamic axes (seq, batch): the QLSTM's output shapes come from probing and the
    C kernel takes the run's sizes (SEQ / NB, its pool decisions C conditions over them); it matches
    at three shapes (batch 1 among them), the same at 1 and 2 threads."""
    fp = lstm_model(7, 3, 10, 136, bidirectional=True)
    for value in [*fp.graph.input, *fp.graph.output]:
        dims = value.type.tensor_type.shape.dim
        for axis, name in ((0, "seq"), (1, "batch")) if value.name in ("x", "y") else ((1, "batch"),):
            dims[axis].dim_param = name
    shape = next(t for t in fp.graph.initializer if t.name == "shape")
    shape.CopyFrom(onnx.numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape"))
    q = quantized_lstm(fp, tmp_path, per_channel=True)
    artifact = compile_model(q, tmp_path / "a", golden_cases=1, dims={"seq": (1, 50), "batch": (1, 8)})
    assert ("QLSTM", "c") in _providers(artifact)
    text = _source(artifact)
    assert "const long NB = " in text and "if (NB >= 2 && NB * 136 >= 1024)" in text  # cells on the pool
    one, two, theirs = Session(artifact, threads=1), Session(artifact, threads=2), _ort(q)
    rng = np.random.default_rng(6)
    for seq, batch, tol in ((7, 3, ATOL), (4, 1, ATOL), (12, 8, FLIP_ATOL)):
        feeds = {"x": rng.standard_normal((seq, batch, 10)).astype(np.float32),
                 "h0": rng.standard_normal((2, batch, 136)).astype(np.float32) * 0.5,
                 "c0": rng.standard_normal((2, batch, 136)).astype(np.float32) * 0.5}
        runs = (one.run(None, feeds), two.run(None, feeds), theirs.run(None, feeds))
        for a, b, want in zip(*runs, strict=True):
            assert np.array_equal(a, b) and np.abs(a - want).max() <= tol, (seq, batch)


@pytest.mark.parametrize("name", ["silero-vad-16k-sequence", "oskut-ws"])
def test_real_lstm_models_quantized_dynamically_match_onnxruntime(tmp_path: Path, name: str) -> None:
    """Two pinned models with an LSTM (Silero VAD's, batch 1, hidden 128, h / c as inputs; OSKut's
    tf2onnx bidirectional one over 64 sequences of 21) through quantize_dynamic: the QLSTM runs on C
    and matches onnxruntime's int8 run of the same file (to FLIP_ATOL; measured 4.8e-7 and 1.2e-7 on their
    realistic inputs, 5.4e-5 on OSKut with random ones), straying from the fp32 model as that run does."""
    spec = model_named(name)
    path = fetched_model(name)
    q = tmp_path / "int8.onnx"
    quantize_dynamic(path, q, op_types_to_quantize=["LSTM"], per_channel=True, weight_type=QuantType.QInt8)
    model = onnx.load(q)
    assert "DynamicQuantizeLSTM" in {n.op_type for n in model.graph.node}
    artifact = compile_model(model, tmp_path / "a", golden_cases=1, shapes=spec.shape_options)
    assert ("QLSTM", "c") in _providers(artifact)
    realistic = feeds_for(spec)
    feeds = {**realistic.state, **realistic.steps[0]}  # the first step of its realistic input
    exact = ort.InferenceSession(str(path)).run(None, feeds)
    want = _ort(model).run(None, feeds)
    for got, w, r in zip(Session(artifact).run(None, feeds), want, exact, strict=True):
        assert np.abs(got - w).max() <= FLIP_ATOL
        assert _stray(got, r) <= 1.25 * _stray(w, r) + 0.005
