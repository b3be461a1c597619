"""Emulated CPUs: QEMU's user-mode emulators (``qemu``), emulated x86-64 CPUs as
devices (``cpus``), the aarch64 userland (``aarch64``), and whether an emulation is
faithful to a CPU class's kernels (``fidelity``).
"""
