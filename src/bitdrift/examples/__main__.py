"""python -m bitdrift.examples onnx OUT.onnx INPUTS.npy [--samples N]: write an example
model and its inputs (bitdrift.examples)."""

import argparse

from bitdrift.examples import onnx_cnn

BUILDERS = {"onnx": onnx_cnn.write}

parser = argparse.ArgumentParser(prog="python -m bitdrift.examples", description=__doc__)
parser.add_argument("format", choices=sorted(BUILDERS))
parser.add_argument("model")
parser.add_argument("inputs")
parser.add_argument("--samples", type=int, default=16)
args = parser.parse_args()
BUILDERS[args.format](args.model, args.inputs, samples=args.samples)
