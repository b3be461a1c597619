"""The observer check: does recording every layer change what the model computes?

Per-layer recording runs another program than the one a user deploys: an exported graph
that lists every layer as an output keeps the intermediate tensors, so a runtime cannot
fuse across them (ONNX Runtime fuses MatMul and Add into one Gemm, or Gemm and ReLU into
FusedGemm, only where the tensor between them is no output), and a Keras probe model runs
eagerly where Keras' predict compiles (tf.function, jax.jit). So every repeat also runs
the model as deployed: its final output alone, with the runtime's own graph optimisations
(bitdrift.backends.Session.deployed). The record keeps both final outputs
(bitdrift.record.hdf5: ``output`` the instrumented run's, ``deployed`` the deployed model's),
and the check says, per sample, whether the two are equal bit for bit (each as its most
frequent value over the repeats, as the equivalence classes take it).

The final-output classes are those of the deployed outputs; the per-layer analyses
describe the instrumented program, which for a device whose check fails is not the one
deployed: a finding (findings.md, the report's ``observer_check`` table). The check holds
for what the instrumented run exposed (``instrumented``, EXPOSED): a Keras model's layers,
every node of a user's ONNX graph (on ONNX Runtime, every node of the graph it deploys,
bitdrift.backends.exported.onnx_file), a .pt2 program's module calls, a .tflite file's
tensors.
"""

from __future__ import annotations

from bitdrift.analysis.eqc import summarize_repeats
from bitdrift.record.hdf5 import DEPLOYED, OUTPUT
from bitdrift.record.reader import Record

OBSERVER_COLUMNS = ["model", "device", "backend", "deployed_program", "samples",
                    "equal_samples", "observer_equal", "differing_samples", "deployed_kernels",
                    "instrumented"]

# What the instrumented run exposes, by the model's format (bitdrift.formats; the
# fingerprint's accelerator ``model_format``, a Keras model where it names none), unless
# the session says otherwise (the accelerator's ``exposed``: ONNX Runtime exposes the node
# outputs of its own optimised graph): the observer check holds for that instrumentation
# alone, since exposing more (every node of an ONNX graph, where Keras exposes a layer's
# last node) can stop a fusion the deployed model makes
EXPOSED = {"keras": "one output per Keras layer", "onnx": "every node output of the ONNX graph",
           "pt2": "every module call of the .pt2 program",
           "tflite": "every tensor of the .tflite file"}


def _representative(values, bfloat16: bool):
    """The most frequent of a tensor's repeats (the equivalence classes' representative)."""
    summary, _ = summarize_repeats("", values, "bfloat16" if bfloat16 else values.dtype.name)
    return summary.key


def equal_bits(instrumented, deployed, bfloat16: bool = False) -> bool:
    """Whether the two final outputs (repeats, ...) have the same representative: same
    format, same shape, same bytes."""
    return _representative(instrumented, bfloat16) == _representative(deployed, bfloat16)


def observer_check(samples: dict, program: str) -> dict:
    """The check the inference writes (record attribute ``observer_check``): from
    bitdrift.record.hdf5's sample contents ({sample: {"output", "deployed", ...}}), per sample
    whether the deployed output equals the instrumented one bit for bit."""
    flags = {str(int(sample)): equal_bits(content[OUTPUT], content[DEPLOYED],
                                          bool(content.get("bfloat16")))
             for sample, content in samples.items()}
    return _described(flags, program)


def _described(flags: dict, program: str) -> dict:
    differing = [sample for sample, equal in flags.items() if not equal]
    summary = (f"the deployed model's final output equals the instrumented run's on all "
               f"{len(flags)} samples" if not differing else
               f"instrumentation changed the final output: the deployed model ({program}) "
               f"differs from the instrumented run on {len(differing)} of {len(flags)} "
               f"samples ({', '.join(differing)}); the per-layer analyses describe the "
               "instrumented program")
    return {"program": program, "samples": flags, "equal": not differing, "summary": summary}


def record_check(record: Record) -> dict | None:
    """The observer check recomputed from the record's own datasets (the tables report
    what the record shows, not what its attribute says), on the samples that hold the
    deployed output (``unchecked``: those that do not); None for a record without any
    (written before the check, or by another tool)."""
    checked = [sample for sample in record.samples if sample in record.deployed_samples]
    if not checked:
        return None
    flags = {}
    for sample in checked:
        instrumented = record.instrumented_output(sample)
        deployed = record.deployed_output(sample)
        flags[str(sample)] = instrumented.bfloat16 == deployed.bfloat16 and equal_bits(
            instrumented.values, deployed.values, instrumented.bfloat16)
    program = (record.observer_check or {}).get("program", "")
    return {**_described(flags, program),
            "unchecked": [sample for sample in record.samples if sample not in checked]}


def exposed(record: Record) -> str:
    """What the record's instrumented run exposed as outputs (EXPOSED)."""
    accelerator = (record.fingerprint or {}).get("accelerator") or {}
    if accelerator.get("exposed"):
        return str(accelerator["exposed"])
    found = accelerator.get("model_format") or "keras"
    return EXPOSED.get(found, f"the outputs its {found} session records")


def observer_table(records: list[Record]) -> list[dict]:
    """``observer_check.csv``: per record, on how many of the samples that hold the
    deployed output (``samples``) it equals the instrumented run's, and what that run
    exposed; ``unchecked`` for a record without it. Samples without it are named on
    stderr."""
    import sys

    rows = []
    for record in records:
        row = {"model": record.model, "device": record.device,
               "backend": record.attr("backend"), "samples": len(record.samples),
               "instrumented": exposed(record)}
        check = record_check(record)
        if check is None:
            row["observer_equal"] = "unchecked"
        else:
            flags = check["samples"]
            if check["unchecked"]:
                print(f"bitdrift: warning: {record.path}: samples "
                      f"{', '.join(map(str, check['unchecked']))} hold no deployed output: "
                      f"the observer check is of the other {len(flags)}", file=sys.stderr)
            row.update(samples=len(flags), deployed_program=check["program"],
                       equal_samples=sum(flags.values()),
                       observer_equal="yes" if check["equal"] else "no",
                       differing_samples=" ".join(s for s, equal in flags.items()
                                                  if not equal),
                       deployed_kernels=kernels_note(record))
        rows.append({column: row.get(column) for column in OBSERVER_COLUMNS})
    return rows


def compare_kernels(graphs: dict) -> dict:
    """The traced repeat's comparison of the deployed graph's kernels with the instrumented
    graph's ({"deployed": [KernelCall as dict], "instrumented": [...]}, each in graph
    order): both lists of implementations, whether they differ as multisets, and what
    each has that the other lacks (counted: ``ort FusedGemm x2``)."""
    from collections import Counter

    names = {side: [call["implementation"] for call in graphs[side]]
             for side in ("deployed", "instrumented")}
    deployed, instrumented = Counter(names["deployed"]), Counter(names["instrumented"])

    def listed(counts: Counter) -> list[str]:
        return [name if count == 1 else f"{name} x{count}"
                for name, count in sorted(counts.items())]

    return {"deployed": names["deployed"], "instrumented": names["instrumented"],
            "differs": deployed != instrumented,
            "only_deployed": listed(deployed - instrumented),
            "only_instrumented": listed(instrumented - deployed)}


def kernels_note(record: Record) -> str | None:
    """The deployed graph's kernels where they differ from the instrumented graph's, as
    the traced repeat named them; None where it did not compare them (a Keras runtime, a
    record without the traced repeat)."""
    compared = (record.kernels or {}).get("deployed")
    if not isinstance(compared, dict) or "differs" not in compared:
        return None
    if not compared["differs"]:
        return "same kernels"
    return (f"{' + '.join(compared['only_deployed']) or 'nothing'} in place of "
            f"{' + '.join(compared['only_instrumented']) or 'nothing'}")


def changed_devices(rows: list[dict]) -> list[dict]:
    """The rows of observer_table whose instrumentation changed the final output."""
    return [row for row in rows if row.get("observer_equal") == "no"]
