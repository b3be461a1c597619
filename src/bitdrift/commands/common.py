"""What several commands share: the config, the records checked against the workflow's
files, the `--expect` option, and the guard that no output overwrites an input."""

from __future__ import annotations

import sys

from bitdrift.errors import ConfigError

PRECISIONS = ("float16", "bfloat16", "float32", "float64")


def read_config(path):
    from bitdrift.config import load_config

    return load_config(path)


def model_spec(config, model):
    if model not in config["models"]:
        raise ConfigError(f"unknown model {model!r} (config has {sorted(config['models'])})")
    return config["models"][model]


def expect_option(parser) -> None:
    parser.add_argument(
        "--expect", nargs=3, action="append", metavar=("MODEL", "MODEL_FILE", "DATASET_FILE"),
        help="refuse records of MODEL not produced from this model file and dataset "
             "(repeatable; the workflow passes its own files)")


def default_workers() -> int:
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, 4))


def expect_triples(expect) -> list[tuple[str, str, str]]:
    """The (model, model file, inputs file) triples of ``expect``: triples already, or
    the flat `--expect MODEL MODEL_FILE INPUTS_FILE ...` arguments the workflow's rules
    pass (bitdrift.plan.Plan.expect_arguments)."""
    expect = list(expect or [])
    if expect and expect[0] == "--expect":
        return [tuple(expect[at + 1:at + 4]) for at in range(0, len(expect), 4)]
    return [tuple(triple) for triple in expect]


def open_checked(files, expect=None, recheck: bool = False):
    """Open the records; with ``expect`` (expect_triples), check them against the
    workflow's files, and with ``recheck`` recompute each record's effective precision
    with the model at hand."""
    from bitdrift.record.hdf5 import RecordError
    from bitdrift.record.reader import open_records

    records = open_records(files)
    expect = expect_triples(expect)
    if not expect:
        return records
    # Only here: provenance reads models and datasets (~20 ms of imports).
    from bitdrift.analysis.effective_precision import recheck_record
    from bitdrift.run.provenance import check_layout, check_provenance

    check_layout(records, [model for model, _, _ in expect])
    for model, model_path, dataset_path in expect:
        if not check_provenance(records, model, model_path, dataset_path):
            raise RecordError(f"--expect {model}: no record of that model among the files")
        if recheck:
            # The tables that report effective precision recompute it with the model at
            # hand instead of reading what the inference wrote
            for record in records:
                if record.model == model:
                    warning = recheck_record(record, model_path, dataset_path)
                    if warning:
                        print(f"bitdrift: warning: {warning}", file=sys.stderr)
    return records


def outputs_together(function):
    """A command's library function whose outputs appear together or not at all (a full
    disk at the last one), called from the command line or a workflow script alike."""
    import functools

    @functools.wraps(function)
    def together(*args, **kwargs):
        from bitdrift.atomic import output_group

        with output_group():
            return function(*args, **kwargs)

    return together


def refuse_overwriting(inputs: dict, outputs: dict, folders=()) -> None:
    """No output may be an input (named or defaulted) or another output: `infer --out`
    equal to the default model file replaced the model with a record, and `eqc --out X
    --layers-out X` wrote one table over the other. Both maps: flag -> path. Each output
    then passes bitdrift.atomic.check_output (a folder if its flag is in ``folders``)."""
    from pathlib import Path

    from bitdrift.atomic import check_output

    seen = {}
    for flag, path in inputs.items():
        for one in path if isinstance(path, list) else [path]:
            if one:
                seen.setdefault(Path(one).resolve(), flag)
    for flag, path in outputs.items():
        if not path:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            other = seen[resolved]
            what = "also an input" if other in inputs else f"also the output of {other}"
            raise ConfigError(f"{flag} {path} is {what} ({other}); refusing to overwrite it")
        seen[resolved] = flag
    for flag, path in outputs.items():
        if path:
            check_output(flag, path, folder=flag in folders)
