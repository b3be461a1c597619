#!/usr/bin/env bash
# Snakemake runs this in the environment of envs/bitdrift.yaml once it has created it
# (--sdm conda, the SLURM profile's nodes). Devices with `emulate` run under QEMU's
# user mode, which cluster nodes seldom have: Debian's statically linked build goes into
# the environment's bin, checked against Debian's index (bitdrift install-qemu).
set -euo pipefail
bitdrift install-qemu --prefix "$CONDA_PREFIX" --targets x86_64
