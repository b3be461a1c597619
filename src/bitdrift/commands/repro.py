"""`bitdrift repro`: the first layer where two devices part, as a folder of one-layer
scripts that reproduce each device's bits (bitdrift.run.repro)."""

from __future__ import annotations


def cmd_repro(args) -> int:
    from bitdrift.run.repro import check_repro, write_repro

    summary = write_repro(args.files[0], args.files[1], args.model_file, args.out,
                          dataset_path=args.dataset_file)
    print(f"bitdrift: {summary['model']}: the devices part at layer {summary['layer']} "
          f"({summary['class_name']}, fed by {summary['inbound']}); wrote {args.out}")
    if not args.check:
        return 0
    results = check_repro(args.out)
    reproduced = 0
    for name, result in results.items():
        verdict = "reproduced" if result["reproduced"] else \
            f"NOT reproduced ({result['why'] or 'printed ' + result['printed'][:16]})"
        print(f"bitdrift: {name}: {result['expected'][:16]} in the record; {verdict}")
        reproduced += result["reproduced"]
    if reproduced < len(results):
        print(f"bitdrift: {reproduced} of {len(results)} scripts reproduce their record")
        return 1
    print("bitdrift: both scripts reproduce their record: different digests, each the "
          "record's own")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("repro", help="write a minimal reproduction of where two records "
                       "part: the layer's input and weights and one script per device")
    p.add_argument("files", nargs=2, metavar="RECORD", help="the two devices' records")
    p.add_argument("--model-file", required=True,
                   help="the model the records ran (.keras, or .onnx)")
    p.add_argument("--dataset-file", help="the dataset the records ran on (needed when "
                   "the layer reads the model input)")
    p.add_argument("--out", required=True, help="folder to write (replaced if it holds an "
                   "earlier repro)")
    p.add_argument("--check", action="store_true", help="run both scripts and compare their "
                   "digests with the records (exit 1 unless both reproduce)")
    p.set_defaults(func=cmd_repro, out_folder=True)
