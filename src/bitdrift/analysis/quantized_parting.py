"""Where and why two devices' runs of a quantized model part (issue 65): per pair of its
devices whose final outputs are not bit-identical, the first layer in graph order (of
those both records hold) whose bits differ, and, where that layer is an integer matmul
(a MatMulInteger, a QLinearMatMul), how the two devices' integers part
(bitdrift.analysis.integer.how_they_part) and which numpy replay of the layer each
device's integers equal bit for bit: exact int32 accumulation (VNNI, AMX) or AVX2's
u8 x s8 pairs summed into saturated int16 (vpmaddubsw), and for a requantising layer
each rounding mode.

The replay reads the layer's uint8/int8 input and its zero point from the record (a
quantized layer's integers are kept as they are, with their scale and zero point:
bitdrift.backends.exported.onnx_file.quantization_params) and its weights from the model
file. A MatMulInteger's int32 output is compared as it is. Where ONNX Runtime has fused
the MatMulInteger with its dequantization (MatMulIntegerToFloat, DynamicQuantizeMatMul),
the recorded layer is the float product; each device's accumulators are then recovered
from it (round((y - bias) / (input scale x weight scale)), exact while they stay below
2^22) and the verdict says so; a value such a graph does not hold (the codes inside a
DynamicQuantizeMatMul) is read from the other device's record. Where the integers agree
and the dequantization after them parts, or the first parting layer is any other op,
it is named by its op and nothing is replayed (a ConvInteger is named, not replayed).
"""

from __future__ import annotations

import itertools

import numpy as np

COLUMNS = ["model", "first_device", "second_device", "layer", "op", "integer_layer",
           "samples_apart", "cause", "detail", "first_replay", "second_replay",
           "overflowing_pairs", "first_kernels", "second_kernels"]
MATMUL_INTEGER = "MatMulInteger"
# the float ops between a MatMulInteger and the value a fused node outputs (quantize_dynamic
# writes Cast -> Mul (scale) -> Add (bias))
DEQUANTIZING_OPS = ("Cast", "Mul", "Add")
CONV_INTEGER = "ConvInteger"  # named where it parts; its im2col pairing is not replayed
INTEGER_PRODUCTS = (MATMUL_INTEGER, CONV_INTEGER)
FEEDS = {"Add": ("Mul", "Cast", *INTEGER_PRODUCTS), "Mul": ("Cast", *INTEGER_PRODUCTS),
         "Cast": INTEGER_PRODUCTS}
# float32 holds every integer below 2^24; the recovered accumulator is trusted below 2^22
RECOVERABLE = 1 << 22


def _graph(model_file):
    """(nodes by output name, constants by name) of the ONNX file, every value named as
    the record names it (bitdrift.record.hdf5's dataset names: "/" as "__")."""
    import onnx
    from onnx import numpy_helper

    from bitdrift.record.hdf5 import OUTPUT, _sanitize

    graph = onnx.load(str(model_file), load_external_data=False).graph
    constants = {_sanitize(tensor.name): numpy_helper.to_array(tensor)
                 for tensor in graph.initializer}
    producer = {}
    for original in graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        del node.input[:], node.output[:]
        node.input.extend(_sanitize(name) for name in original.input)
        node.output.extend(_sanitize(name) for name in original.output)
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    constants[node.output[0]] = numpy_helper.to_array(attribute.t)
        for output in node.output:
            producer[output] = node
    if len(graph.output) == 1 and _sanitize(graph.output[0].name) in producer:
        # the record's final output, under the name the record gives it
        producer[OUTPUT] = producer[_sanitize(graph.output[0].name)]
    return producer, constants


def matmul_of(layer: str, producer: dict, constants: dict):
    """(the MatMulInteger or ConvInteger node, whether ``layer`` is its output itself,
    the dequantizing nodes in between, from ``layer`` back) for a layer that is such a
    node's output or its dequantized product (DEQUANTIZING_OPS back to one); None
    otherwise."""
    node = producer.get(layer)
    chain = []
    while node is not None and node.op_type in DEQUANTIZING_OPS and len(chain) < 3:
        chain.append(node)
        sources = [name for name in node.input if name in producer and
                   name not in constants and producer[name].op_type != "Constant"]
        # back along the integer product: Add <- Mul <- Cast <- MatMulInteger (a Mul's
        # other operand is the scales' product, itself a Mul)
        wanted = FEEDS[node.op_type]
        found = [producer[name] for name in sources if producer[name].op_type in wanted]
        node = found[0] if len(found) == 1 else None
    if node is None or node.op_type not in INTEGER_PRODUCTS:
        return None
    return node, not chain, chain


def _value(record, sample: int, name: str, constants: dict):
    """A value by name: a constant of the file, else the record's layer (first repeat);
    None where neither holds it."""
    if name in constants:
        return np.asarray(constants[name])
    if name in record.layer_labels(sample):
        return record.tensor(sample, name).values[0]
    return None


def _bias(chain, constants) -> np.ndarray | None:
    """The float32 bias the dequantization adds (the Add's constant operand), 0 without an
    Add; None where the Add's operand is no constant."""
    for node in chain:
        if node.op_type == "Add":
            found = next((constants[name] for name in node.input if name in constants), None)
            return None if found is None else np.asarray(found, np.float32)
    return np.zeros((), np.float32)


def _held(records: list, sample: int, name: str, constants: dict):
    """(a value by name: a constant of the file, else a recorded layer of the records that
    hold it (a runtime that fused it away records none), or None; why not, or which
    devices lack it). Records that both hold it must agree bit for bit."""
    if not name:
        return None, "no such input"
    if name in constants:
        return np.asarray(constants[name]), ""
    found = {record.device: _value(record, sample, name, constants) for record in records}
    held = {device: value for device, value in found.items() if value is not None}
    if not held:
        return None, f"{name} is recorded on no device"
    values = list(held.values())
    if any(not np.array_equal(values[0], value) for value in values[1:]):
        return None, f"{name} differs between the devices"
    lacking = [device for device in found if device not in held]
    return values[0], (f"{name} from {', '.join(held)}'s record ({', '.join(lacking)}'s "
                       "graph fused it away)" if lacking else "")


def _scale_product(records, sample, chain, producer, constants):
    """The float32 scale of the dequantization: the Mul's constant operand, or where that
    operand is a Mul of the input's and the weight's scales (quantize_dynamic), their
    float32 product; None where unknown."""
    for node in chain:
        if node.op_type != "Mul":
            continue
        for name in node.input:
            source = producer.get(name)
            if source is not None and source.op_type == "Mul":
                factors = [_held(records, sample, factor, constants)[0]
                           for factor in source.input]
                if all(factor is not None for factor in factors):
                    return np.float32(np.asarray(factors[0], np.float32).reshape(-1)[0]
                                      * np.asarray(factors[1], np.float32).reshape(-1)[0])
            elif name in constants and (source is None or source.op_type != "Cast"):
                return np.float32(np.asarray(constants[name], np.float32).reshape(-1)[0])
    return None


def layer_replay(records: list, sample: int, name: str, node, direct: bool, chain,
                 producer, constants):
    """(the layer (integer.QuantizedLinear), its input rows (M, K) codes, each record's
    int32 accumulators (M, N), per record whether they were recovered from the float
    product rather than recorded, notes on values read from one device's record alone)
    for one sample, or a string saying why there is none."""
    from bitdrift.analysis import integer

    weights = constants.get(node.input[1])
    if weights is None or weights.ndim != 2:
        return f"the weights {node.input[1]} are no constant 2-D matrix of the file"
    codes, note = _held(records, sample, node.input[0], constants)
    if codes is None:
        return f"its input codes: {note}"
    notes = [note] if note else []
    zero_points = []
    for index in (2, 3):
        if len(node.input) <= index or not node.input[index]:
            zero_points.append(0)
            continue
        value, note = _held(records, sample, node.input[index], constants)
        if value is None:
            return f"its zero point: {note}"
        notes += [note] if note else []
        value = np.asarray(value).reshape(-1)
        zero_points.append(value.astype(np.int64) if value.size > 1 else int(value[0]))
    rows = np.asarray(codes).reshape(-1, weights.shape[0])
    layer = integer.QuantizedLinear(weights=weights, input_scale=1.0,
                                    input_zero_point=int(np.asarray(zero_points[0])),
                                    weight_scale=1.0, weight_zero_point=zero_points[1])
    accumulators, recovered = [], []
    for record in records:
        # the MatMulInteger's own int32 output where this record holds it (a device
        # without graph optimisations), else recovered from the fused float product
        held = direct or node.output[0] in record.layer_labels(sample)
        recovered.append(not held)
        values = np.asarray(record.tensor(sample, node.output[0] if held else name)
                            .values[0])
        if held:
            accumulators.append(values.reshape(rows.shape[0], -1).astype(np.int32))
            continue
        scale = _scale_product(records, sample, chain, producer, constants)
        bias = _bias(chain, constants)
        if scale is None or bias is None:
            return "the dequantization's scale or bias is not known"
        found = (values.astype(np.float64) - bias.astype(np.float64)) / np.float64(scale)
        if np.abs(found).max(initial=0) >= RECOVERABLE:
            return "its accumulators are too large to be recovered from the float output"
        accumulators.append(np.rint(found).astype(np.int32).reshape(rows.shape[0], -1))
    return layer, rows, accumulators, recovered, notes


def qlinear_replay(records: list, sample: int, node, constants):
    """(the layer, its input rows (M, K) codes, each record's output codes (M, N), no
    record's recovered) of a QLinearMatMul (a, a_scale, a_zero_point, b, b_scale,
    b_zero_point, y_scale, y_zero_point; b a constant) for one sample, or why not."""
    from bitdrift.analysis import integer

    weights = constants.get(node.input[3])
    if weights is None or weights.ndim != 2:
        return f"the weights {node.input[3]} are no constant 2-D matrix of the file"
    params, notes = [], []
    for index in (0, 1, 2, 4, 5, 6, 7):
        value, note = _held(records, sample, node.input[index], constants)
        if value is None:
            return f"input {index} of the QLinearMatMul: {note}"
        params.append(value)
        notes += [note] if note else []
    codes = params.pop(0)
    a_scale, a_zero, b_scale, b_zero, y_scale, y_zero = (np.asarray(value)
                                                         for value in params)

    def scalar_or_columns(value, kind):
        value = value.reshape(-1)
        return value.astype(kind) if value.size > 1 else kind(value[0])

    layer = integer.QuantizedLinear(
        weights=weights, input_scale=float(a_scale.reshape(-1)[0]),
        input_zero_point=int(a_zero.reshape(-1)[0]),
        weight_scale=scalar_or_columns(b_scale, np.float32),
        weight_zero_point=scalar_or_columns(b_zero, np.int64),
        output_scale=float(y_scale.reshape(-1)[0]),
        output_zero_point=int(y_zero.reshape(-1)[0]), output_dtype=y_zero.dtype.type)
    rows = np.asarray(codes).reshape(-1, weights.shape[0])
    outputs = [np.asarray(record.tensor(sample, node.output[0]).values[0])
               .reshape(rows.shape[0], -1) for record in records]
    return layer, rows, outputs, [False, False], notes


def matching_replays(values: np.ndarray, layer, rows: np.ndarray) -> set:
    """The replays of ``layer`` on ``rows`` that ``values`` equal bit for bit:
    {(accumulation, rounding or None)} (bitdrift.analysis.integer: exact int32 and, for
    u8 x s8, the saturated 16-bit pairs; each rounding where the layer requantises)."""
    from bitdrift.analysis import integer

    paths = [integer.EXACT] + ([integer.SATURATED] if rows.dtype == np.uint8 and
                               layer.weights.dtype == np.int8 else [])
    roundings = [None] if layer.output_scale is None else list(integer.ROUNDINGS)
    return {(path, rounding) for path in paths for rounding in roundings
            if np.array_equal(values, integer.layer_outputs(
                layer, rows, path == integer.SATURATED, rounding or integer.HALF_TO_EVEN))}


def replay_verdict(matches: list[set], pairs: int, recovered: bool) -> str:
    """One device's verdict over the parting samples (``matches``: per sample, the replays
    its integers equal: matching_replays)."""
    from bitdrift.analysis import integer

    what = "its accumulators (recovered from its float output)" if recovered \
        else "its integers"
    common = set.intersection(*matches) if matches else set()
    if not common:
        matched = sum(bool(found) for found in matches)
        return (f"{what}: replay matches neither (no replay gives them in "
                f"{len(matches) - matched} of {len(matches)} samples)")
    paths = {path for path, _ in common}
    roundings = sorted({rounding for _, rounding in common if rounding})
    rounded = f", rounded {' or '.join(roundings)}" if roundings else ""
    if paths == {integer.SATURATED}:
        return f"{what} = saturated-16-bit replay{rounded} bit for bit, {pairs} pairs overflow"
    if integer.SATURATED in paths:
        return (f"{what} = exact int32 replay{rounded} bit for bit (the saturated 16-bit "
                "path gives the same: no pair overflows)")
    return f"{what} = exact int32 replay{rounded} bit for bit"


def _first_parting(first, second, samples: list[int]):
    """(the first layer (LayerInfo of ``first``) in graph order both records hold whose
    bits differ in some sample, those samples); (None, []) where none does."""
    held = {info.label: info for info in second.layers(samples[0])}
    for info in first.layers(samples[0]):
        if info.label not in held:
            continue
        apart = [sample for sample in samples
                 if first.digests(sample, info)[0] != second.digests(sample,
                                                                     held[info.label])[0]]
        if apart:
            return info, apart
    return None, []


def _kernels(record, layer: str) -> str:
    """The kernels the record's traced repeat names for ``layer`` (a dataset name), as
    bitdrift.analysis.kernels signs them ("ort ms:MatMulIntegerToFloat"); "" without."""
    from bitdrift.analysis.kernels import record_signatures
    from bitdrift.record.hdf5 import _sanitize

    try:
        found = record_signatures(record) or {}
    except Exception as error:  # a record whose kernels cannot be read: said, not fatal
        return f"unreadable ({type(error).__name__})"
    return {_sanitize(name): signature for name, signature in found.items()}.get(layer, "")


def compare_pair(model: str, first, second, producer: dict, constants: dict) -> dict | None:
    """The row of one pair of records of a quantized model; None where their final
    outputs are bit-identical on every sample both hold."""
    from bitdrift.analysis import integer
    from bitdrift.record.hdf5 import OUTPUT

    samples = [sample for sample in first.value_samples if sample in second.value_samples]
    if not samples:
        return None
    if all(first.digests(sample, OUTPUT)[0] == second.digests(sample, OUTPUT)[0]
           for sample in samples):
        return None
    row = {"model": model, "first_device": first.device, "second_device": second.device}
    info, apart = _first_parting(first, second, samples)
    if info is None:
        return {**row, "layer": OUTPUT, "op": "", "integer_layer": False, "samples_apart": 0,
                "cause": "the final output only",
                "detail": "no recorded layer both hold parts; the final outputs do"}
    name = OUTPUT if info.final else info.name
    node = producer.get(name)
    op = info.class_name or (node.op_type if node is not None else "")
    # the traced kernels name the final output by the graph's own name
    kernel_layer = node.output[0] if info.final and node is not None else name
    row.update({"layer": name, "op": op, "samples_apart": len(apart),
                "first_kernels": _kernels(first, kernel_layer),
                "second_kernels": _kernels(second, kernel_layer)})
    found = matmul_of(name, producer, constants)
    qlinear = node is not None and node.op_type == "QLinearMatMul"
    if found is None and not qlinear:
        integer_op = node is not None and (node.op_type in ("DynamicQuantizeLinear",
                                                            "QuantizeLinear", "ConvInteger")
                                           or node.op_type.startswith("QLinear"))
        kernels = (row["first_kernels"], row["second_kernels"])
        return {**row, "integer_layer": integer_op,
                "cause": f"an integer layer bitdrift does not replay ({op})" if integer_op
                else "the first parting layer is not an integer layer (" + (
                    f"float op {op})" if op else "the record names no op: its integers, if "
                    "any, are not exposed)"),
                "detail": f"another kernel: {kernels[0]} against {kernels[1]}"
                if all(kernels) and kernels[0] != kernels[1] else "",
                "first_replay": "", "second_replay": ""}
    row["integer_layer"] = qlinear or found[1]
    if found is not None and not found[1]:
        row["op"] = (f"{op}: dequantized {found[0].op_type} {found[0].output[0]} (fused by "
                     "the runtime)")
    if found is not None and found[0].op_type == CONV_INTEGER:
        return {**row, "cause": f"an integer layer bitdrift does not replay ({CONV_INTEGER})",
                "detail": "a convolution's u8 x s8 pairs follow its kernel's im2col "
                          "layout, which the replay does not model", "first_replay": "",
                "second_replay": ""}
    causes, details, matches, pairs, recovered = [], [], ([], []), 0, (False, False)
    for sample in apart:
        replayed = qlinear_replay([first, second], sample, node, constants) if qlinear \
            else layer_replay([first, second], sample, name, *found, producer, constants)
        if isinstance(replayed, str):
            return {**row, "cause": "not replayed", "detail": replayed,
                    "first_replay": "", "second_replay": ""}
        layer, rows, (one, two), recovered, notes = replayed
        parting = integer.how_they_part(one, two, layer, rows)
        causes.append(parting.verdict)
        details.append(f"sample {sample}: {parting.detail}"
                       + "".join(f"; {note}" for note in dict.fromkeys(notes)))
        if rows.dtype == np.uint8 and layer.weights.dtype == np.int8:
            pairs += integer.saturating_pairs(rows, layer.weights)
        for values, kept in zip((one, two), matches, strict=True):
            kept.append(matching_replays(values, layer, rows))
    if set(causes) == {integer.IDENTICAL}:
        # the integers agree (recorded, or recovered from the product): the float
        # dequantization after them parts
        return {**row, "integer_layer": False,
                "cause": f"the first parting layer is not an integer layer (float op "
                         f"{node.op_type if node is not None else op})",
                "detail": f"the integers of {found[0].output[0] if found else name} are the "
                          "same on both devices; the float dequantization after them parts",
                "first_replay": "", "second_replay": ""}
    row.update({"cause": "; ".join(sorted(set(causes))), "detail": details[0],
                "first_replay": replay_verdict(matches[0], pairs, recovered[0]),
                "second_replay": replay_verdict(matches[1], pairs, recovered[1]),
                "overflowing_pairs": pairs})
    return row


def parting_table(models) -> list[dict]:
    """The rows of every (quantized model, its file, [its records]) in ``models``: a row
    per pair of devices that ran it and whose final outputs part."""
    from bitdrift.formats import detect
    from bitdrift.record.reader import Record, read_failure

    rows = []
    for model, model_file, paths in models:
        # the integer replay reads an ONNX graph; a .tflite's or a .pt2's integers are not
        # in its records (their runtimes do not expose them): named, never replayed
        try:
            producer, constants = _graph(model_file) if detect(model_file) == "onnx" \
                else ({}, {})
        except Exception as error:  # one model's graph never fails the table
            rows.append({"model": model, "cause": "not analysed",
                         "detail": f"{model_file}: {type(error).__name__}: {error}"[:300]})
            continue
        ran = [path for path in paths if read_failure(path) is None]
        for one, two in itertools.combinations(ran, 2):
            with Record(one) as first, Record(two) as second:
                try:
                    row = compare_pair(model, first, second, producer, constants)
                except Exception as error:  # one pair's analysis never fails the table
                    row = {"model": model, "first_device": first.device,
                           "second_device": second.device, "cause": "not analysed",
                           "detail": f"{type(error).__name__}: {error}"[:300]}
            if row is not None:
                rows.append(row)
    return rows


def write_parting_table(models, out) -> None:
    """parting_table's rows as a CSV (and HTML), written atomically."""
    from bitdrift.atomic import write_csv

    rows = [{column: row.get(column) for column in COLUMNS} for row in parting_table(models)]
    write_csv(rows, out, columns=COLUMNS)
    print(f"bitdrift: {len(rows)} pairs of quantized devices part; wrote {out}")
