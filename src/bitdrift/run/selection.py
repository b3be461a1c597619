"""What a device runs and records of the configured samples: the test images that fill its
batches (the samples first), the samples whose layers keep their values
(analysis.full_samples), the batches its traced repeat runs (analysis.traced_samples) and
the layers recorded (analysis.layer_select). The parent (bitdrift.run.inference) decides
these before the repeats; a repeat (bitdrift.run.repeat) runs the batches."""

from __future__ import annotations

from bitdrift.errors import InferenceError


def batch_indices(samples: list[int], batch_size: int, n_test: int) -> list[int]:
    """Samples first, then the following test images not among them, up to a whole batch.

    A device's batch size changes the kernels chosen (GEMM shapes), so the padding is part
    of the device; the filler images are fixed, so every device sees the same inputs.
    """
    total = -(-len(samples) // batch_size) * batch_size
    chosen = set(samples)
    filler = [i for i in range(n_test) if i not in chosen][: total - len(samples)]
    if len(samples) + len(filler) < total:
        raise InferenceError(f"test set too small for batch size {batch_size}")
    return list(samples) + filler


def full_sample_list(samples: list[int], full_samples) -> list[int]:
    """The samples whose layers keep their values (analysis.full_samples): None all, an
    integer N the first N of ``samples``, a list those of ``samples`` it names."""
    if full_samples is None:
        return list(samples)
    if isinstance(full_samples, int) and not isinstance(full_samples, bool):
        return list(samples)[:full_samples]
    unknown = [sample for sample in full_samples if sample not in samples]
    if unknown:
        raise InferenceError(f"config key analysis.full_samples: {unknown} not among the "
                             f"samples {list(samples)}")
    return [sample for sample in samples if sample in set(full_samples)]


def traced_batch_numbers(samples: list[int], full: list[int], batch_size: int,
                         traced_samples: str) -> list[int] | None:
    """The batches a traced repeat runs (analysis.traced_samples): None for every batch
    ("all"); for "full" those holding a full sample, the first batch where there is none.
    Every batch of a device has one shape (the last is filled up: batch_indices), so
    these run the kernels the others do; their samples alone are checked against the
    measured repeats (merge_repeats)."""
    if traced_samples == "all":
        return None
    if traced_samples != "full":
        raise InferenceError(f"config key analysis.traced_samples: {traced_samples!r} is "
                             "neither 'all' nor 'full'")
    rows = [samples.index(sample) for sample in full] or [0]
    return sorted({row // batch_size for row in rows})


def selected_positions(model_layers: list, layer_select, model_name: str) -> set[int]:
    """Positions of the layers analysis.layer_select names (by layer name or Keras class);
    None selects all. A name that is no layer or class of the model is refused in one line."""
    if layer_select is None:
        return set(range(len(model_layers)))
    names = {name for name, _ in model_layers} | {cls for _, cls in model_layers}
    unknown = [name for name in layer_select if name not in names]
    if unknown:
        raise InferenceError(
            f"config key analysis.layer_select: {', '.join(map(repr, unknown))} names no "
            f"layer or layer class of model {model_name!r} (classes: "
            f"{', '.join(sorted({cls for _, cls in model_layers}))})")
    return {position for position, (name, cls) in enumerate(model_layers)
            if name in layer_select or cls in layer_select}
