"""Triton Python-backend model of an onnx-aot artifact: ``MODEL_REPO/NAME/1/model.py``.

``onnx-aot export-triton`` (``runtime/serving/triton.py``) copies this file next to the artifact
(``1/artifact``). ``initialize`` loads it with ``runtime.Session`` (every hash checked);
``execute`` runs the requests Triton's dynamic batcher gathered: with ``max_batch_size > 0`` each
request holds a batch along axis 0, and requests whose other dims agree run as one concatenated
run, split back (``runtime/serving/batching.py``); with 0, one run per request. A request the
runtime refuses gets an error response with the runtime's one-line message; the others are
answered. Needs ``onnx-aot-runtime`` (numpy) in Triton's Python environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from runtime.errors import InputError
from runtime.errors import OnnxAotError
from runtime.serving.batching import groups
from runtime.serving.batching import run_concatenated
from runtime.session import Session


class TritonPythonModel:
    """The artifact in ``1/artifact`` served by Triton (see the module docstring)."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self.max_batch = int(config.get("max_batch_size", 0))
        folder = Path(args["model_repository"]) / str(args["model_version"]) / "artifact"
        self.session = Session(folder, verify_weights=True)
        self.inputs = [s.name for s in self.session.inputs]
        self.outputs = [s.name for s in self.session.outputs]

    def _feeds(self, request: Any) -> dict[str, Any]:
        feeds = {}
        for name in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise InputError(f"missing input {name!r}; the model's inputs are "
                                   f"{', '.join(map(repr, self.inputs))}")
            feeds[name] = tensor.as_numpy()
        return feeds

    def _answer(self, outputs: list[Any]) -> Any:
        tensors = [pb_utils.Tensor(name, array) for name, array in zip(self.outputs, outputs, strict=True)]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _failed(self, exc: Exception) -> Any:
        message = " ".join(str(exc).split())
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))

    def _run(self, feeds: dict[str, Any]) -> list[Any]:
        return self.session.run(None, feeds)

    def _one(self, feeds: dict[str, Any]) -> Any:
        try:
            return self._answer(self._run(feeds))
        except OnnxAotError as exc:
            return self._failed(exc)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        feeds: dict[int, dict[str, Any]] = {}
        for index, request in enumerate(requests):
            try:
                feeds[index] = self._feeds(request)
            except OnnxAotError as exc:
                responses[index] = self._failed(exc)
        order = sorted(feeds)
        if self.max_batch <= 0:
            for index in order:
                responses[index] = self._one(feeds[index])
            return responses
        for run in groups([feeds[i] for i in order], self.max_batch, batched=True):
            members = [order[k] for k in run]
            try:
                results = run_concatenated(self._run, [feeds[i] for i in members])
            except OnnxAotError:  # one request's batch refused: each alone, so only its own fails
                results = None
            for pos, index in enumerate(members):
                responses[index] = self._one(feeds[index]) if results is None else self._answer(results[pos])
        return responses

    def finalize(self) -> None:
        del self.session
