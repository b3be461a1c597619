"""Benchmark: how well HDF5's filters compress recorded activations (run on demand).

    python benchmarks/record_compression.py RECORD.h5 [RECORD.h5 ...] [--resnet50]

For every layer of every sample of each record (repeat 0: identical repeats are stored
once in format 4), and with ``--resnet50`` the activations of a Keras ResNet-50 at 224x224
(bitdrift.models.resnet50, untrained, Glorot weights) on two digits upscaled to 224x224,
stores the values once per filter in an HDF5 file held in memory and sums the bytes
stored: raw / stored is the ratio. The filters: gzip (levels 1, 4, 9) and LZF, each with and
without HDF5's byte shuffle. Prints one line per filter and source.
"""

from __future__ import annotations

import argparse
import time
import uuid

import h5py
import numpy as np

FILTERS = {
    "none": {},
    "gzip-4": {"compression": "gzip", "compression_opts": 4},
    "lzf": {"compression": "lzf"},
    "shuffle+lzf": {"shuffle": True, "compression": "lzf"},
    "shuffle+gzip-1": {"shuffle": True, "compression": "gzip", "compression_opts": 1},
    "shuffle+gzip-4": {"shuffle": True, "compression": "gzip", "compression_opts": 4},
    "shuffle+gzip-9": {"shuffle": True, "compression": "gzip", "compression_opts": 9},
}


def record_layers(path: str):
    """(name, values) of repeat 0 of every tensor with values in a record."""
    from bitdrift.record import Record

    with Record(path) as record:
        for sample in record.value_samples:
            for info in record.layers(sample):
                yield f"{sample}/{info.label}", record.tensor(sample, info).values[0]


def resnet50_layers():
    """ResNet-50 at 224 on two digits: every layer's output for each image."""
    import keras

    from bitdrift.datasets import read_test_images
    from bitdrift.models import resnet50
    from bitdrift.paths import dataset_file

    model = resnet50(keras, (224, 224, 3), 10)
    images = read_test_images(dataset_file("digits"), [0, 1]).astype(np.float32)
    images = keras.ops.convert_to_numpy(keras.ops.image.resize(images, (224, 224)))
    probe = keras.Model(model.inputs, [layer.output for layer in model.layers[1:]])
    for layer, values in zip(model.layers[1:], probe(images, training=False), strict=True):
        for row, sample in enumerate(np.asarray(values)):
            yield f"{row}/{layer.name}", sample


def measure(tensors) -> dict:
    """{filter: (raw bytes, stored bytes, seconds)} over ``tensors``."""
    files = {name: h5py.File(f"{uuid.uuid4()}.h5", "w", driver="core", backing_store=False)
             for name in FILTERS}
    found = {name: [0, 0, 0.0] for name in FILTERS}
    for key, values in tensors:
        values = np.ascontiguousarray(values)[None]
        for name, options in FILTERS.items():
            start = time.perf_counter()
            dataset = files[name].create_dataset(key, data=values, chunks=values.shape,
                                                 fletcher32=True, **options)
            found[name][2] += time.perf_counter() - start
            found[name][0] += values.nbytes
            found[name][1] += dataset.id.get_storage_size()
    for handle in files.values():
        handle.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="*")
    parser.add_argument("--resnet50", action="store_true")
    args = parser.parse_args()
    sources = [(path, record_layers(path)) for path in args.records]
    if args.resnet50:
        sources.append(("resnet50 at 224 (2 digits, untrained)", resnet50_layers()))
    for source, tensors in sources:
        for name, (raw, stored, seconds) in measure(tensors).items():
            print(f"{source}: {name:16s} raw {raw / 1e6:8.2f} MB  stored {stored / 1e6:8.2f} MB"
                  f"  ratio {raw / stored:5.2f}  {raw / 1e6 / seconds:7.1f} MB/s")


if __name__ == "__main__":
    main()
