"""The replay of torch's MKL sgemm on two CPUs: this host, and QEMU's model of a CPU of
the other vendor (MKL picks its code by vendor). Each CPU's kernel is revealed and its
outputs replayed in numpy; where two products meet, which one the kernel fuses is what
each run finds, checked against exact arithmetic (fractions), never a CPU's expected
answer."""

import json
import os
import subprocess
from fractions import Fraction

import numpy as np
import pytest

F32 = np.float32
# dense_2 of cifar10_small, made smaller: 64 inputs, 32 units, at batch 1 (the default
# run's torch devices) and at batch 8 (MKL's sgemm picks other code by batch)
TERMS, UNITS, ROWS = 64, 32, 32
BATCHES = (1, 8)

# Run in a fresh process, natively or under QEMU: the tree of torch.matmul(x, kernel) +
# bias (Keras' Dense on torch) at each batch, revealed on rows of ones, and its outputs
# for random rows, one batch per call, saved to an .npz with the CPU the process saw.
KERNEL_RUN = """
import json, sys
import numpy as np
import torch
from bitdrift.analysis.accumulation.reveal import reveal
from bitdrift.analysis.accumulation.trees import to_flat
from bitdrift.emulation.cpus import seen_cpu

torch.set_num_threads(1)
terms, units, rows, batches, out = json.loads(sys.argv[1])
rng = np.random.default_rng(63)
x = rng.standard_normal((rows, terms)).astype(np.float32)
kernel = rng.standard_normal((terms, units)).astype(np.float32)
bias = rng.standard_normal(units).astype(np.float32)

def dense(weights, shift, inputs):
    with torch.no_grad():
        return (torch.matmul(torch.from_numpy(inputs), torch.from_numpy(weights))
                + torch.from_numpy(shift)).numpy()

saved = {"x": x, "kernel": kernel, "bias": bias}
for batch in batches:
    ones = np.ones((batch, terms), np.float32)
    tree = reveal(lambda weights, shift: dense(weights, shift, ones), terms, units)
    saved[f"tree_{batch}"] = np.array(json.dumps(to_flat(tree)))
    saved[f"out_{batch}"] = np.concatenate([dense(kernel, bias, x[start:start + batch])
                                            for start in range(0, rows, batch)])
saved["vendor"] = np.array(seen_cpu()["vendor"])
np.savez(out, **saved)
"""


def other_vendors_model() -> str:
    """QEMU's model of a CPU of another vendor than the host's (/proc/cpuinfo), with
    AVX2 and FMA (MKL's FMA code runs under QEMU's TCG, which has no AVX-512)."""
    from bitdrift.emulation.fidelity import host_vendor, model_vendor

    return next(model for model in ("EPYC-Rome-v2", "Haswell-v4")
                if model_vendor(model) != host_vendor())


def kernel_run(tmp_path, emulate: str | None) -> dict:
    from bitdrift.emulation.cpus import python_command

    out = tmp_path / f"{emulate or 'host'}.npz"
    done = subprocess.run(
        [*python_command({"emulate": emulate} if emulate else {}), "-c", KERNEL_RUN,
         json.dumps([TERMS, UNITS, ROWS, list(BATCHES), str(out)])],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as found:
        return {key: found[key] for key in found.files}


def nearest_float32(value: Fraction) -> F32:
    """The float32 nearest to a Fraction, ties to even."""
    guess = F32(float(value))  # within one float32 step of it
    for candidate in (np.nextafter(guess, F32(-np.inf)), np.nextafter(guess, F32(np.inf))):
        here, there = abs(Fraction(float(guess)) - value), abs(Fraction(float(candidate)) - value)
        if there < here or (there == here and int(candidate.view(np.uint32)) % 2 == 0):
            guess = candidate
    return guess


def exact_tree_sum(nodes: list, terms: int, products: list, bias, fma: bool,
                   fused_product: str | None) -> F32:
    """One output summed in the tree ``nodes`` (the record's flat form: term ``terms`` the
    bias, a child from ``terms`` + 1 on an earlier node) by a kernel that rounds each
    operation once, in exact arithmetic: without ``fma`` each product rounded and each
    addition; with it, a product meeting a partial sum or the bias added to it with one
    rounding, and of two products meeting, the one of ``fused_product``'s index (``higher
    index``, ``lower index``) added with one rounding to the other, rounded alone. Written
    apart from the replay: the truth it is checked against."""
    first_node = terms + 1
    covered: list[list[int]] = []  # each node's terms

    def terms_of(kid):
        return [kid] if kid < first_node else covered[kid - first_node]

    def exact(kid):  # a leaf's exact value or a node's float32 one, as a Fraction
        return Fraction(float(bias)) if kid == terms else products[kid] if kid < terms \
            else Fraction(float(values[kid - first_node]))

    values: list[F32] = []
    for children in nodes:
        kids = sorted(children, key=lambda kid: min(terms_of(kid)))
        covered.append([term for kid in kids for term in terms_of(kid)])
        multiplied = [kid for kid in kids if kid < terms]
        if fma and len(kids) == 2 and multiplied:
            if len(multiplied) == 2:
                rounded, fused = multiplied if fused_product == "higher index" \
                    else multiplied[::-1]
                base = Fraction(float(nearest_float32(exact(rounded))))
            else:
                (fused,) = multiplied
                base = exact(next(kid for kid in kids if kid != fused))
            values.append(nearest_float32(base + exact(fused)))
            continue
        total = None
        for kid in kids:
            value = nearest_float32(exact(kid))  # a product rounded; others are float32
            total = value if total is None else nearest_float32(
                Fraction(float(total)) + Fraction(float(value)))
        values.append(total)
    return values[-1]


def replayed(run: dict, batch: int) -> dict:
    """replay_layers' entry for the run's Dense layer at ``batch``."""
    from bitdrift.analysis.accumulation.replay import replay_layers

    entry = {"trees": [json.loads(str(run[f"tree_{batch}"]))], "terms": TERMS + 1,
             "bias": True}
    return replay_layers(
        {"dense": entry}, {"dense": {"class_name": "Dense", "inbound": "input",
                                     "activation": "linear"}},
        {"weights/dense/0": run["kernel"], "weights/dense/1": run["bias"]},
        {"input": run["x"], "dense": run[f"out_{batch}"]}, "float32",
        replay_samples=ROWS)["dense"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The kernel on this host and under QEMU's model of the other vendor's CPU."""
    from bitdrift.emulation.fidelity import host_vendor, model_vendor

    folder = tmp_path_factory.mktemp("cpus")
    model = other_vendors_model()
    found = {"host": kernel_run(folder, None), model: kernel_run(folder, model)}
    assert str(found["host"]["vendor"]) == host_vendor()
    assert str(found[model]["vendor"]) == model_vendor(model) != host_vendor()
    return found


def test_mkl_replays_on_both_vendors_with_the_fused_product_each_records(runs):
    """On each CPU and batch, the replay gives the kernel's bits; where it does with FMA
    and two products meet, it records one product (the values tell: not ``either``),
    and a kernel computed in exact arithmetic (fractions) with that product fused gives
    the CPU's bits where the other choice gives others; without FMA, exact arithmetic
    with rounded products gives them. What each CPU chose is printed, not expected."""
    from bitdrift.analysis.accumulation.replay import replay
    from bitdrift.analysis.accumulation.trees import from_flat

    said = {}
    for cpu, run in runs.items():
        for batch in BATCHES:
            entry = replayed(run, batch)
            said[(cpu, batch)] = (entry["replay"], entry.get("fused_product"))
            assert entry["replay"] in ("bit-identical with FMA", "bit-identical without FMA"), \
                (cpu, batch, entry)
            nodes = json.loads(str(run[f"tree_{batch}"]))
            out, x, kernel, bias = run[f"out_{batch}"], run["x"], run["kernel"], run["bias"]

            def exact(row, unit, fma, fused_product, nodes=nodes, x=x, kernel=kernel,
                      bias=bias):
                products = [Fraction(float(x[row, k])) * Fraction(float(kernel[k, unit]))
                            for k in range(TERMS)]
                return exact_tree_sum(nodes, TERMS, products, bias[unit], fma, fused_product)

            # a few values, where the arithmetics part if they do, each in exact arithmetic
            if entry["replay"] == "bit-identical without FMA":
                places = [(0, 0), (ROWS - 1, UNITS - 1)]
                for row, unit in places:
                    assert exact(row, unit, False, None) == out[row, unit], (cpu, batch)
                continue
            product = entry.get("fused_product")
            if product is None:  # no node where two products meet
                continue
            assert product in ("higher index", "lower index"), (cpu, batch, entry)
            other = "lower index" if product == "higher index" else "higher index"
            tree = from_flat(nodes, TERMS + 1)
            parted = np.argwhere(replay(tree, x, kernel, bias, True, other).view(np.uint32)
                                 != out.view(np.uint32))
            assert len(parted), (cpu, batch, entry)  # else the record would say either
            for row, unit in [tuple(place) for place in parted[:4]]:
                assert exact(row, unit, True, product) == out[row, unit], (cpu, batch)
                assert exact(row, unit, True, other) != out[row, unit], (cpu, batch)
    print("\n".join(f"{cpu}, batch {batch}: {verdict}" + (f", {product} fused" if product
                                                         else "")
                    for (cpu, batch), (verdict, product) in said.items()))
