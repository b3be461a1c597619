"""python -m bitdrift.inputs.examples NAME OUT_MODEL OUT_INPUTS [--samples N]: write an example
model and its inputs (bitdrift.inputs.examples)."""

import argparse

from bitdrift.inputs.examples import EXAMPLES, write_example

parser = argparse.ArgumentParser(prog="python -m bitdrift.inputs.examples", description=__doc__)
parser.add_argument("name", choices=EXAMPLES)
parser.add_argument("model")
parser.add_argument("inputs")
parser.add_argument("--samples", type=int, default=16)
args = parser.parse_args()
write_example(args.name, args.model, args.inputs, samples=args.samples)
