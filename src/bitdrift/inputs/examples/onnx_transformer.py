"""The attention encoder of bitdrift.inputs.examples.torch_transformer exported to ONNX with
``torch.onnx.export`` (opset 17), as a user exports a transformer: its Linear layers become
MatMul nodes on 3-D activations (batch, tokens, features) with constant weights, and an
Add of the bias; the attention's ``Q @ K^T`` and ``softmax @ V`` MatMul nodes of two
activations (batch, heads, tokens, features per head); the batch axis dynamic.
``causal=True``: the decoder block; ``traced_shapes=True``: the heads split by a shape
read from the input (Shape, Gather, Concat, Reshape nodes). Its inputs: the torch
example's."""

from __future__ import annotations

import numpy as np

from bitdrift.inputs.examples.torch_transformer import INPUT_SHAPE, build_module, make_inputs

SUFFIX = ".onnx"
OPSET = 17


def build_model(seed: int = 0, causal: bool = False, traced_shapes: bool = False):
    """The module exported, as an onnx ModelProto (the TorchScript exporter: the one that
    writes opset 17 as given); ``traced_shapes``: build_module's."""
    import io
    import warnings

    import onnx
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():  # the exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(build_module(seed, causal, traced_shapes),
                          (torch.zeros((2, *INPUT_SHAPE)),),
                          buffer, opset_version=OPSET, dynamo=False, input_names=["tokens"],
                          output_names=["logits"],
                          dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}})
    return onnx.load_from_string(buffer.getvalue())


def write(model_path, inputs_path, samples: int = 16, seed: int = 0, causal: bool = False,
          traced_shapes: bool = False) -> None:
    """The model and its inputs, each written atomically."""
    import onnx

    from bitdrift.atomic import atomic_output

    with atomic_output(model_path) as tmp:
        onnx.save(build_model(seed, causal, traced_shapes), tmp)
    with atomic_output(inputs_path) as tmp:
        with open(tmp, "wb") as handle:
            np.save(handle, make_inputs(samples))
