"""A small convolutional network as an ONNX graph made with onnx.helper, NCHW: Conv,
Relu, MaxPool, Flatten, Gemm, Relu, MatMul, Add; seeded weights. Its inputs: seeded
normal samples of shape (samples, 3, 16, 16), float32."""

from __future__ import annotations

import numpy as np

INPUT_SHAPE = (3, 16, 16)
CLASSES = 10
SUFFIX = ".onnx"


def build_model(seed: int = 0, opset: int = 17, op: str = "Relu"):
    """The model as an onnx ModelProto; ``op`` is the activation node's op type (a test
    names an op a runtime lacks here)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weights(name, *shape):
        scale = 1 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else shape[0])
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name)

    constants = [weights("conv.weight", 8, 3, 3, 3), weights("conv.bias", 8),
                 weights("fc1.weight", 32, 8 * 8 * 8), weights("fc1.bias", 32),
                 weights("fc2.weight", 32, CLASSES), weights("fc2.bias", CLASSES)]
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["conv"], name="conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node(op, ["conv"], ["conv_relu"], name="conv_relu"),
        helper.make_node("MaxPool", ["conv_relu"], ["pool"], name="pool",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["flatten"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flatten", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1",
                         transB=1),
        helper.make_node("Relu", ["fc1"], ["fc1_relu"], name="fc1_relu"),
        helper.make_node("MatMul", ["fc1_relu", "fc2.weight"], ["fc2_matmul"],
                         name="fc2_matmul"),
        helper.make_node("Add", ["fc2_matmul", "fc2.bias"], ["logits"], name="fc2_add"),
    ]
    graph = helper.make_graph(
        nodes, "onnx_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *INPUT_SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="bitdrift.inputs.examples.onnx_cnn")
    model.ir_version = 8  # what every runtime here reads
    return model


def make_inputs(samples: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(
        (samples, *INPUT_SHAPE)).astype(np.float32)


def write(model_path, inputs_path, samples: int = 16, seed: int = 0) -> None:
    """The model and its inputs, each written atomically."""
    import onnx

    from bitdrift.atomic import atomic_output

    with atomic_output(model_path) as tmp:
        onnx.save(build_model(seed), tmp)
    with atomic_output(inputs_path) as tmp:
        with open(tmp, "wb") as handle:
                np.save(handle, make_inputs(samples))
