"""Benchmark: the order search of a model whose layers share probes (config
analysis.kernels), every layer searched against one search per probe, run on demand.

    python benchmarks/order_reuse.py [--size 32] [--batch 1] [--backend tensorflow]

Keras' ResNet-50 (untrained, ``--size`` x ``--size`` inputs: the same 54 Conv2D and Dense
layers as at 224, of the same distinct probe specs, on smaller grids) opened as a device
opens it (bitdrift.backends.open_session, one thread, the device's environment), its orders
revealed by bitdrift.run.orders.reveal_orders with ``reuse=False`` (every layer searched)
and with ``reuse=True`` (a layer whose probe is an earlier layer's takes its search): the
seconds of each, the searches, and whether the two give every layer the same order.
Printed as a Markdown table with the host's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAVE = ("import sys, keras; keras.utils.set_random_seed(0); keras.applications.ResNet50("
        "weights=None, input_shape=(int(sys.argv[2]), int(sys.argv[2]), 3), classes=10)"
        ".save(sys.argv[1])")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--backend", default="tensorflow")
    args = parser.parse_args()
    from bitdrift.run.devices import device_environment

    device = {"accelerator": "cpu", "threads": 1, "batch_size": args.batch,
              "precision": "float32", "env": {}, "repeats": 1, "external": False,
              "backend": args.backend}
    os.environ.update(device_environment(device))
    import cpuinfo

    from bitdrift import backends
    from bitdrift.run.orders import reveal_orders

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "resnet50.keras"
        # saved by a process of its own: building it here would start the runtime before
        # the session sets its threads
        subprocess.run([sys.executable, "-c", SAVE, str(model), str(args.size)], check=True)
        import keras

        session = backends.open_session({"device": device, "model_path": str(model),
                                         "layers": True}, "bench")
        cpu = cpuinfo.get_cpu_info()
        print(f"CPU: {cpu.get('brand_raw')} ({cpu.get('count')} CPUs), Keras "
              f"{keras.__version__} on {args.backend}, one thread, batch {args.batch}, "
              f"ResNet-50 at {args.size}x{args.size}, {len(session.order_layers)} layers\n")
        print("| search | searches | seconds |")
        print("|---|---|---|")
        found = {}
        for reuse in (True, False):  # the one that searches less first: no warm-up for it
            start = time.perf_counter()
            found[reuse] = reveal_orders(session, device, reuse=reuse, log=sys.stderr,
                                         what=f"resnet50 at {args.size}")
            seconds = time.perf_counter() - start
            searches = sum("searched_at" not in entry for entry in found[reuse].values())
            print(f"| {'one per probe' if reuse else 'every layer'} | {searches} | "
                  f"{seconds:.1f} |", flush=True)
        same = {layer: {key: value for key, value in entry.items() if key != "searched_at"}
                for layer, entry in found[True].items()} == found[False]
        print(f"\nthe same order at every layer: {same}")
        print(json.dumps({layer: entry.get("searched_at") for layer, entry in
                          found[True].items()}), file=sys.stderr)


if __name__ == "__main__":
    main()
