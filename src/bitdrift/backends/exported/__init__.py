"""Runtimes that run an exported file (ONNX Runtime, OpenVINO, LiteRT): one module each,
what they share (``common``), and the Keras model's own outputs that an export is
checked against (``expected``, the file ``reference.npz``).
"""
