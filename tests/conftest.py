import json

import numpy as np
import pytest

from bitdrift.record import write_record

BASE_ATTRS = {"backend": "tensorflow", "precision": "float32", "model_sha256": "m" * 64,
              "input_sha256": "i" * 64, "fingerprint": {"hostname": "test"}}


@pytest.fixture
def make_record(tmp_path):
    """Write a record for a device from {sample: output repeats array} (and layers)."""

    def make(device, outputs, model="net", layers=None, **attrs):
        samples = {}
        for sample, values in outputs.items():
            content = {"output": np.asarray(values)}
            if layers is not None:
                content["layers"] = [(name, np.asarray(v)) for name, v in layers[sample]]
            samples[sample] = content
        path = tmp_path / f"{model}_{device}.h5"
        write_record(path, {**BASE_ATTRS, "model": model, "device": device, **attrs}, samples)
        return path

    return make


def fingerprint_json():
    return json.dumps({"hostname": "test"})
