"""Emulated CPUs: is QEMU faithful to the kernels a CPU class runs."""

from __future__ import annotations

import sys


def cmd_emulation_check(args) -> int:
    from bitdrift.atomic import write_csv
    from bitdrift.emulation.fidelity import COLUMNS, NO_REFERENCE, MismatchError, check

    try:
        rows = check(args.kernels, args.models)
    except MismatchError as error:
        write_csv(error.rows, args.out, columns=COLUMNS)  # the evidence, then the error
        print(f"bitdrift: error: {error}", file=sys.stderr)
        return error.exit_code
    write_csv(rows, args.out, columns=COLUMNS)
    faithful = sum(row["verdict"] == "faithful" for row in rows)
    unreferenced = sum(row["verdict"].startswith(NO_REFERENCE) for row in rows)
    print(f"bitdrift: emulation check: {faithful} forced kernel(s) faithful, bit for bit; "
          f"{unreferenced} without a native reference; "
          f"{len(rows) - faithful - unreferenced} informational -> {args.out}",
          file=sys.stderr)
    return 0


def cmd_install_qemu(args) -> int:
    from bitdrift.emulation.qemu import install_qemu

    done = install_qemu(args.prefix, args.targets, args.mirror, args.suite)
    print(f"bitdrift: QEMU {done['version']} (Debian's static build): "
          f"{', '.join(done['installed'])}", file=sys.stderr)
    return 0


def cmd_install_aarch64(args) -> int:
    from bitdrift.emulation import aarch64

    done = aarch64.install(mirror=args.mirror, runtimes=args.runtimes)
    print(f"bitdrift: aarch64 userland ({len(done['packages'])} Debian arm64 packages; "
          f"{', '.join(done['wheels'])}) under QEMU {done['qemu']} -> "
          f"{aarch64.folder()}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
    from bitdrift.emulation.fidelity import CLASSES, KERNELS

    p = sub.add_parser("emulation-check", help="are emulated CPUs faithful: small kernels "
                       "under QEMU against the host forced to that CPU class's kernels")
    p.add_argument("--kernels", nargs="+", choices=list(KERNELS), default=list(KERNELS),
                   help="default: all")
    p.add_argument("--models", nargs="+", choices=list(CLASSES), default=list(CLASSES),
                   help="emulated CPU models (default: all)")
    p.add_argument("--out", required=True, help="the table (CSV)")
    p.set_defaults(func=cmd_emulation_check)

    from bitdrift.emulation.qemu import DEBIAN_MIRROR, DEBIAN_SUITE

    p = sub.add_parser("install-qemu", help="QEMU's user-mode emulators (Debian's static "
                       "build) into this environment, for nodes without apt-get or root")
    p.add_argument("--prefix", default=sys.prefix,
                   help="installs into PREFIX/bin (default: this environment)")
    p.add_argument("--targets", nargs="+", default=["x86_64"],
                   help="QEMU targets (default x86_64; aarch64 for Arm CPUs, which need QEMU 10 "
                   "or newer: --suite trixie, or `bitdrift install-aarch64`)")
    p.add_argument("--mirror", default=DEBIAN_MIRROR, help="a Debian mirror (default: %(default)s)")
    p.add_argument("--suite", default=DEBIAN_SUITE,
                   help="the Debian release whose qemu-user-static is taken (default: "
                   "%(default)s, QEMU 7.2)")
    p.set_defaults(func=cmd_install_qemu)

    p = sub.add_parser("install-aarch64", help="what emulated Arm devices run in: QEMU 10, "
                       "Debian's arm64 python and aarch64 wheels of their runtimes, into this "
                       "environment")
    # no --prefix: Arm devices look for their userland in the environment that runs them
    from bitdrift.emulation.aarch64 import DEFAULT_RUNTIMES, RUNTIMES

    p.add_argument("--runtimes", nargs="+", choices=list(RUNTIMES),
                   default=list(DEFAULT_RUNTIMES),
                   help="runtimes to hold, besides those already built (default: "
                   "%(default)s; tensorflow adds 1.6 GB)")
    p.add_argument("--mirror", default=DEBIAN_MIRROR, help="a Debian mirror (default: %(default)s)")
    p.set_defaults(func=cmd_install_aarch64)
