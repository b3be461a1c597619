"""benchmarks/per_sample.py: the per-batch lines the inference writes, read back, and the
wall they give at more samples, against sums done by hand."""

import importlib.util
import sys

import pytest

from bitdrift.run.repeat import batch_seconds_line
from tests.utils import ROOT

SPEC = importlib.util.spec_from_file_location("benchmark_per_sample",
                                              ROOT / "benchmarks" / "per_sample.py")
per_sample = sys.modules[SPEC.name] = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(per_sample)


def _log(traced_full: bool) -> str:
    """A job's log as bitdrift.run.repeat writes it: two measured repeats of 3 batches of 2
    (instrumented and deployed passes) and a traced repeat of 1 batch or of all 3."""
    traced_batches = 1 if traced_full else 3
    which = " on the batches of samples [1] alone (analysis.traced_samples: full)" \
        if traced_full else ""
    lines = []
    for repeat in (1, 2):
        lines += [f"bitdrift: m on d: repeat {repeat}/2 in a fresh process",
                  batch_seconds_line("instrumented", [5.0, 1.0, 1.5], 2),
                  batch_seconds_line("deployed", [2.0, 0.25, 0.25], 2),
                  "bitdrift: work 12.000 s"]
    lines += [f"bitdrift: m on d: traced repeat (kernel logs) in a fresh process{which}",
              batch_seconds_line("instrumented", [6.0] + [3.0] * (traced_batches - 1), 2)]
    return "\n".join(lines) + "\n"


def test_the_pass_lines_read_back():
    found = per_sample.passes(_log(traced_full=False))
    assert [(item["repeat"], item["run"], item["batches"]) for item in found] == [
        ("repeat 1/2", "instrumented", 3), ("repeat 1/2", "deployed", 3),
        ("repeat 2/2", "instrumented", 3), ("repeat 2/2", "deployed", 3),
        ("traced repeat", "instrumented", 3)]
    assert [item["per_batch"] for item in found] == [1.25, 0.25, 1.25, 0.25, 3.0]
    assert found[0]["seconds"] == 7.5 and found[0]["first"] == 5.0
    # a pass of one batch has no "then": its first batch stands for each
    assert per_sample.passes(_log(traced_full=True))[-1]["per_batch"] == 6.0


@pytest.mark.parametrize("traced_full", [False, True])
def test_the_wall_at_more_samples(traced_full):
    """5 samples in batches of 2 are 3 batches, 100 are 50: 47 more batches, each
    costing both measured repeats' passes (2 x (1.25 + 0.25) s) and the traced repeat's
    3 s unless it ran the full samples' batch alone."""
    reading = per_sample.job_reading(_log(traced_full), wall=60.0, samples=5, target=100)
    each = 2 * (1.25 + 0.25) + (0 if traced_full else 3.0)
    assert reading["growing_s_per_batch"] == each
    assert reading["fixed_traced"] is traced_full
    assert reading["wall_s_at_target"] == pytest.approx(60.0 + 47 * each)
    with pytest.raises(ValueError, match="no pass line"):
        per_sample.job_reading("bitdrift: work 1.0 s\n", 1.0, 5, 100)


def test_the_greedy_schedule():
    """Longest first: the 2-thread 10 s job alone, then the 6 s and 4 s side by side;
    a job asking for more threads than cores takes them all."""
    assert per_sample.schedule([(4.0, 1), (10.0, 2), (6.0, 1)], cores=2) == 16.0
    assert per_sample.schedule([(3.0, 1), (3.0, 1), (3.0, 1)], cores=2) == 6.0
    assert per_sample.schedule([(5.0, 8)], cores=2) == 5.0
