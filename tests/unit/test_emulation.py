"""Emulated CPUs as devices (QEMU user mode): real runs under qemu-x86_64, checked against
the host forced to the same kernels, and the config's refusals."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bitdrift.config import validate_config
from bitdrift.emulation.cpus import (
    FAMILIES,
    GCC_MARCH,
    check_device,
    gcc_march,
    python_command,
    seen_cpu,
)
from bitdrift.emulation.fidelity import host_vendor
from bitdrift.errors import ConfigError, InferenceError

# One thread: MKL and oneDNN split work by the topology CPUID reports, which QEMU's model
# and the host do not share
CPU = {"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float32",
       "env": {}, "repeats": 1, "external": False}


@pytest.fixture(scope="module")
def small_model(small_model_copy, tmp_path_factory):
    return small_model_copy(tmp_path_factory.mktemp("emulated"))


def _run(small_model, tmp_path, name, device):
    from bitdrift.record.reader import Record
    from bitdrift.run.inference import infer

    dataset, model = small_model
    out = tmp_path / f"{name}.h5"
    with open(tmp_path / f"{name}.log", "w") as log:
        infer(model_name="small", device_name=name, device={**CPU, **device}, model_path=model,
              dataset_path=dataset, samples=[0, 6], out=out, log=log, kernels=True)
    with Record(out) as record:
        values = {(sample, info.label): record.tensor(sample, info).values
                  for sample in (0, 6) for info in record.layers(sample)}
        return values, record.kernels, record.fingerprint


def test_an_emulated_haswell_equals_the_host_forced_to_avx2_bit_for_bit(small_model, tmp_path):
    """torch's oneDNN and MKL under `qemu-x86_64 -cpu Haswell-v4` give, in every layer,
    the bits of the host with both libraries capped at AVX2 (ONEDNN_MAX_CPU_ISA,
    MKL_ENABLE_INSTRUCTIONS): the emulation is faithful. The traced repeat's kernels name
    no instruction set the emulated CPU lacks, and the record names the emulated CPU (its
    CPUID), QEMU and the host.

    MKL picks its code path by vendor too: the emulated Haswell is an Intel CPU, and on an
    AMD host no setting reaches MKL's Intel AVX2 path (MKL_CBWR=AVX2 becomes CNR:AUTO
    there; capped at AVX2, its sgemm at conv2d's shape gives other bits, seen on a Zen 4
    EPYC). On a host that is not Intel both runs therefore use MKL's vendor-independent
    path (MKL_CBWR=COMPATIBLE), and the comparison checks oneDNN's AVX2 kernels and MKL's
    compatible one under emulation."""
    mkl = {} if host_vendor() == "GenuineIntel" else {"MKL_CBWR": "COMPATIBLE"}
    emulated, kernels, fingerprint = _run(small_model, tmp_path, "haswell", {
        "backend": "torch", "emulate": "Haswell-v4", "env": mkl})
    capped, capped_kernels, _ = _run(small_model, tmp_path, "capped", {
        "backend": "torch", "env": {"ONEDNN_MAX_CPU_ISA": "AVX2",
                                    "MKL_ENABLE_INSTRUCTIONS": "AVX2", **mkl}})
    assert emulated.keys() == capped.keys()
    for key, values in emulated.items():
        assert np.array_equal(values, capped[key]), key
    flags = set(fingerprint["cpu"]["flags"])
    assert {"avx2", "fma"} <= flags and not any(flag.startswith("avx512") for flag in flags)
    assert "Haswell" in fingerprint["cpu"]["brand"]
    assert fingerprint["emulation"]["model"] == "Haswell-v4"
    assert fingerprint["emulation"]["qemu"] and fingerprint["emulation"]["host_flags"]
    names = [call["implementation"] for entry in kernels["layers"].values()
             for call in entry["calls"] if call["library"] == "onednn"]
    assert names and not any("avx512" in name or "amx" in name for name in names), names
    assert kernels["layers"]["conv2d_1"]["signature"] == \
        capped_kernels["layers"]["conv2d_1"]["signature"]


@pytest.mark.parametrize("family", ["Penryn", "Nehalem", "SandyBridge", "IvyBridge", "Haswell",
                                    "EPYC-Rome"])
def test_the_instruction_sets_of_a_family_are_what_qemu_shows(family):
    """The table the config check reads against CPUID inside QEMU."""
    code = ("import json; from bitdrift.emulation.cpus import seen_cpu; "
            "print(json.dumps(seen_cpu()))")
    done = subprocess.run([*python_command({"emulate": family}), "-c", code],
                          capture_output=True, text=True, check=True)
    flags = set(json.loads(done.stdout.strip().splitlines()[-1])["flags"])
    for name in ("sse4_1", "sse4_2", "avx", "f16c", "avx2", "fma"):
        assert (name in flags) == (name in FAMILIES[family]), (family, name)
    assert not any(flag.startswith("avx512") for flag in flags)


GCC_OPTIONS = {"sse4_1": "-msse4.1", "sse4_2": "-msse4.2", "avx": "-mavx", "f16c": "-mf16c",
               "avx2": "-mavx2", "fma": "-mfma"}


@pytest.mark.parametrize("family", sorted(name for name, sets in FAMILIES.items()
                                           if "sse4_2" in sets))
def test_inductors_march_for_an_emulated_cpu_enables_only_its_instruction_sets(family):
    """torch_inductor's C++ kernels under emulation are compiled for the emulated CPU: gcc's
    own list of what its -march enables, against the sets QEMU shows (FAMILIES)."""
    march = gcc_march(f"{family}-v1" if family[0].isupper() else family)
    assert march == GCC_MARCH[family]
    done = subprocess.run(["gcc", f"-march={march}", "-Q", "--help=target"],
                          capture_output=True, text=True, check=True)
    enabled = {line.split()[0] for line in done.stdout.splitlines()
               if line.strip().endswith("[enabled]")}
    for name, option in GCC_OPTIONS.items():
        assert (option in enabled) == (name in FAMILIES[family]), (family, march, option)
    assert not any(option.startswith(("-mavx512", "-mamx")) for option in enabled)
    assert gcc_march(None) is None and gcc_march("neoverse-n1") is None


def test_the_host_is_seen_natively():
    assert seen_cpu()["flags"]  # the same reader, without QEMU: the host's own CPUID


@pytest.mark.parametrize(("device", "message"), [
    ({"backend": "torch", "accelerator": "cpu", "emulate": "Skylake-Server-v4"},
     "'Skylake-Server-v4' has AVX-512, which QEMU's TCG does not emulate"),
    ({"backend": "torch", "accelerator": "cpu", "emulate": "Pentium-v9"},
     "not a CPU model QEMU emulates in full"),
    ({"backend": "torch", "accelerator": "gpu", "emulate": "Haswell-v4"},
     "an emulated CPU runs on the CPU"),
    ({"backend": "tensorflow", "accelerator": "cpu", "emulate": "Nehalem-v2"},
     "backend 'tensorflow' needs AVX, which Nehalem-v2 lacks"),
    ({"backend": "openvino", "accelerator": "cpu", "emulate": "Penryn"},
     "backend 'openvino' needs SSE4.2, which Penryn lacks"),
    ({"backend": "torch", "accelerator": "cpu", "emulate": "neoverse-n1"},
     "backend 'torch' does not run on the emulated Arm CPU neoverse-n1"),
    ({"backend": "litert", "accelerator": "gpu", "emulate": "a64fx"},
     "an emulated CPU runs on the CPU")])
def test_an_emulated_device_that_cannot_run_is_refused_naming_the_key(device, message):
    with pytest.raises(ConfigError, match="devices.d.emulate") as error:
        check_device("d", device)
    assert message in str(error.value)


def test_the_schema_offers_only_models_qemu_emulates_in_full():
    config = {"samples": [0], "datasets": {"digits": {"source": "digits"}},
              "models": {"m": {"architecture": "cifar10_small", "dataset": "digits"}},
              "devices": {"d": {"accelerator": "cpu", "backend": "torch",
                                "emulate": "Icelake-Server"}}}
    with pytest.raises(ConfigError, match="devices.d.emulate") as refused:
        validate_config(config)
    # the refusal says why: a CPU with AVX-512, which TCG does not run (issue 51)
    assert "'Icelake-Server' has AVX-512, which QEMU's TCG does not emulate" in \
        str(refused.value)
    config["devices"]["d"]["emulate"] = "Icelake"  # no such model: the accepted ones
    with pytest.raises(ConfigError, match="is not one of the .* accepted values"):
        validate_config(config)


def test_the_models_refused_as_beyond_tcg_are_those_qemu_runs_without_their_sets():
    """Each model the refusal names as having AVX-512, AMX, FMA4 or XOP is one that this
    QEMU lists and warns, at start, that TCG runs without those sets (truth from QEMU)."""
    import re

    from bitdrift.emulation.cpus import BEYOND_TCG_MODELS, QEMU, qemu_path

    qemu = qemu_path() or QEMU
    listed = subprocess.run([qemu, "-cpu", "help"], capture_output=True,  # exits 1
                            text=True).stdout.split()
    checked = [name for name in BEYOND_TCG_MODELS if name in listed]
    assert {"Skylake-Server", "Icelake-Server", "Opteron_G5"} <= set(checked), listed
    for name in checked:
        done = subprocess.run([qemu, "-cpu", name, "/bin/true"], capture_output=True,
                              text=True, timeout=60)
        lost = set(re.findall(r"TCG doesn't support requested feature: CPUID\.[^ ]*?\."
                              r"([a-z0-9_-]+)", done.stderr))
        for stated in BEYOND_TCG_MODELS[name].lower().split(" and "):
            prefix = stated.replace("-", "")
            assert any(feature.startswith(prefix) for feature in lost), (name, stated, lost)


def test_qemu_missing_is_one_line_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("sys.prefix", str(tmp_path))
    with pytest.raises(InferenceError, match="qemu-x86_64, which is neither in .* nor on the "
                       "PATH; install Debian's qemu-user .* or run `bitdrift install-qemu`"):
        python_command({"emulate": "Haswell-v4"})


def serve_mirror(tmp_path, packages, suite="bookworm"):
    """A Debian mirror on a local HTTP server: each package ({name, description, files:
    {path: bytes}}) built by dpkg-deb, and a Packages.xz index naming them (with their
    SHA-256 unless ``sha256`` says otherwise). Returns (url, write_index, server)."""
    import hashlib
    import http.server
    import lzma
    import threading
    from functools import partial

    root = tmp_path / "mirror"
    stanzas = []
    for package in packages:
        folder = tmp_path / "pkg" / package["name"]
        (folder / "DEBIAN").mkdir(parents=True)
        (folder / "DEBIAN" / "control").write_text(
            f"Package: {package['name']}\nVersion: 1:7.2-test\nArchitecture: amd64\n"
            f"Maintainer: bitdrift tests <tests@example.org>\n"
            f"Description: {package['description']}\n")
        for path, payload in package["files"].items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(payload)
        filename = f"pool/main/q/qemu/{package['name']}_7.2-test_amd64.deb"
        (root / filename).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(folder),
                        str(root / filename)], check=True, capture_output=True)
        stanzas.append((package, filename, hashlib.sha256((root / filename).read_bytes())
                        .hexdigest()))
    index = root / "dists" / suite / "main" / "binary-amd64" / "Packages.xz"
    index.parent.mkdir(parents=True)

    def write_index(sha256=None):
        index.write_bytes(lzma.compress("".join(
            f"Package: {package['name']}\nVersion: 1:7.2-test\nFilename: {filename}\n"
            f"Description: {package['description']}\nSHA256: {sha256 or digest}\n\n"
            for package, filename, digest in stanzas).encode()))

    write_index()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}", write_index, server


STAND_IN = b"#!/bin/sh\necho stand-in for qemu-x86_64 \"$@\"\n"


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """The stand-in mirrors' packages are kept in a cache of the test's own, never in the
    user's (bitdrift.emulation.cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "bitdrift"


@pytest.fixture
def debian_mirror(tmp_path, own_cache):
    """bookworm's layout: qemu-user is dynamic (a package without the emulator here),
    qemu-user-static holds usr/bin/qemu-x86_64-static (its payload a stand-in script)."""
    url, write_index, server = serve_mirror(tmp_path, [
        {"name": "qemu-user", "description": "QEMU user mode emulation binaries",
         "files": {"usr/share/doc/qemu-user/README": b"dynamic"}},
        {"name": "qemu-user-static", "description": "QEMU user mode emulation binaries "
         "(static version)", "files": {"usr/bin/qemu-x86_64-static": STAND_IN}}])
    yield url, STAND_IN, write_index
    server.shutdown()


def test_install_qemu_reads_trixies_layout(tmp_path, own_cache):
    """From trixie on, qemu-user itself holds the static emulators (usr/bin/qemu-x86_64)
    and qemu-user-static is a transitional package without them: the static build is
    taken from qemu-user."""
    from bitdrift.emulation.qemu import install_qemu

    url, _, server = serve_mirror(tmp_path, [
        {"name": "qemu-user-static", "description": "QEMU user mode emulation "
         "(compat/transitional package)", "files": {"usr/share/doc/q/README": b"empty"}},
        {"name": "qemu-user", "description": "QEMU user mode emulation (static binaries)",
         "files": {"usr/bin/qemu-x86_64": STAND_IN}}], suite="trixie")
    try:
        done = install_qemu(tmp_path / "env", mirror=url, suite="trixie")
    finally:
        server.shutdown()
    assert (tmp_path / "env" / "bin" / "qemu-x86_64").read_bytes() == STAND_IN
    assert done["installed"] == [str(tmp_path / "env" / "bin" / "qemu-x86_64")]


def test_install_qemu_takes_the_static_build_from_a_debian_mirror(debian_mirror, tmp_path,
                                                                  monkeypatch):
    """`bitdrift install-qemu` on a real .deb (dpkg-deb) from a Debian-shaped mirror over
    HTTP: the payload lands in PREFIX/bin as qemu-x86_64, executable, and an emulated
    device's command then finds it there before the PATH."""
    from bitdrift.cli import main
    from bitdrift.emulation.qemu import qemu_path

    mirror, payload, _ = debian_mirror
    prefix = tmp_path / "env"
    assert main(["install-qemu", "--prefix", str(prefix), "--mirror", mirror]) == 0
    installed = prefix / "bin" / "qemu-x86_64"
    assert installed.read_bytes() == payload and os.access(installed, os.X_OK)
    assert not list((prefix / "bin").glob("*.partial"))
    monkeypatch.setattr("sys.prefix", str(prefix))
    assert qemu_path() == str(installed)


def test_install_qemu_refuses_a_package_that_does_not_match_the_index(debian_mirror,
                                                                      tmp_path):
    from bitdrift.emulation.qemu import install_qemu
    from bitdrift.errors import InstallError

    mirror, _, write_index = debian_mirror
    write_index(sha256="0" * 64)
    with pytest.raises(InstallError, match="does not match the SHA-256"):
        install_qemu(tmp_path / "env", mirror=mirror)
    assert not (tmp_path / "env" / "bin" / "qemu-x86_64").exists()
    with pytest.raises(InstallError, match="lacks .*bin/qemu-aarch64"):
        write_index()
        install_qemu(tmp_path / "env", targets=("aarch64",), mirror=mirror)


def test_install_qemu_takes_a_package_it_fetched_before_from_the_cache(debian_mirror,
                                                                         tmp_path, capsys):
    """A second install takes the package fetched by the first from the user's cache while
    it matches the index's SHA-256: the mirror's copy, replaced meanwhile by other bytes,
    is not read. A cached copy damaged since is said in one line and fetched again (here
    the mirror's other bytes, refused)."""
    import hashlib

    from bitdrift.emulation import cache
    from bitdrift.emulation.qemu import install_qemu
    from bitdrift.errors import InstallError

    mirror, payload, _ = debian_mirror
    install_qemu(tmp_path / "first", mirror=mirror)
    (deb,) = (tmp_path / "mirror").rglob("qemu-user-static_*.deb")
    sha256 = hashlib.sha256(deb.read_bytes()).hexdigest()
    kept = cache.folder() / "debs" / sha256[:2] / f"{sha256}.deb"
    assert kept.read_bytes() == deb.read_bytes()
    deb.write_bytes(b"other bytes")
    install_qemu(tmp_path / "second", mirror=mirror)
    assert (tmp_path / "second" / "bin" / "qemu-x86_64").read_bytes() == payload
    kept.write_bytes(kept.read_bytes()[:-1])
    with pytest.raises(InstallError, match="does not match the SHA-256"):
        install_qemu(tmp_path / "third", mirror=mirror)
    said = [line for line in capsys.readouterr().err.splitlines()  # not the server's log
            if line.startswith("bitdrift:")]
    assert said == [f"bitdrift: the cached {kept} does not match its SHA-256 (damaged); "
                    "fetching it again"]


def _host_flags() -> set:
    with open("/proc/cpuinfo") as cpuinfo:
        return set(next(line for line in cpuinfo if line.startswith("flags")).split())


def test_the_emulation_check_finds_faithful_kernels_and_fails_on_a_wrong_class(
        tmp_path, monkeypatch):
    """`bitdrift emulation-check` on OpenBLAS under Nehalem-v2: the host forced to
    OpenBLAS's Nehalem kernel (SSE) gives other bits than its own (an AVX2 or AVX-512
    kernel), and the emulated Nehalem gives the forced bits (exit 0, faithful). Told that
    Haswell's class is OpenBLAS's Nehalem kernel, the check must fail loudly, naming kernel
    and model."""
    import pandas as pd

    from bitdrift.emulation import fidelity as emulation_check

    if "avx2" not in _host_flags():
        pytest.fail("this test needs an AVX2 host (every CPU bitdrift's CI has run on has it)")
    out = tmp_path / "check.csv"
    done = subprocess.run([sys.executable, "-m", "bitdrift", "emulation-check", "--kernels",
                           "openblas_sgemm", "--models", "Nehalem-v2", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = pd.read_csv(out).to_dict("records")
    assert row["verdict"] == "faithful" and row["native_forced"] != row["host_digest"], row
    monkeypatch.setitem(emulation_check.CLASSES, "Haswell-v4",
                        {"openblas": "Nehalem", "onednn": "AVX2", "mkl": "AVX2"})
    with pytest.raises(emulation_check.MismatchError,
                       match="openblas_sgemm under Haswell-v4 differs from the host with "
                             "OPENBLAS_CORETYPE=Nehalem"):
        emulation_check.check(["openblas_sgemm"], ["Haswell-v4"])


def test_a_switch_that_changes_nothing_on_the_host_is_no_native_reference(monkeypatch):
    """A forced run that gives the host's own bits says nothing about the class: the
    check must say "no native reference", whether the emulated bits equal them or not.
    `ONEDNN_MAX_CPU_ISA=ALL` is oneDNN's default, no cap, on any CPU; and on a host
    without AVX-512 (its flags) the Haswell class's AVX2 cap is no cap either."""
    from bitdrift.emulation import fidelity as emulation_check

    flags = _host_flags()
    monkeypatch.setitem(emulation_check.CLASSES, "Haswell-v4",
                        {"openblas": "Haswell", "onednn": "ALL", "mkl": "AVX2"})
    (row,) = emulation_check.check(["onednn_torch_conv"], ["Haswell-v4"])
    assert row["native_forced"] == row["host_digest"], row
    assert row["verdict"].startswith("no native reference: with ONEDNN_MAX_CPU_ISA=ALL the "
                                     "host gives its own bits"), row
    if not any(flag.startswith("avx512") for flag in flags):
        monkeypatch.undo()
        (row,) = emulation_check.check(["onednn_torch_conv"], ["Haswell-v4"])
        assert row["verdict"].startswith("no native reference: with ONEDNN_MAX_CPU_ISA=AVX2 "
                                         "the host gives its own bits"), row


@pytest.mark.parametrize("case, expected", [
    # (native, emulated, host) digests, by hand
    (("n", "n", "h"), "faithful"),
    (("n", "e", "h"), "MISMATCH"),
    (("h", "h", "h"), "no native reference: with MKL_ENABLE_INSTRUCTIONS=AVX2 the host "
                      "gives its own bits"),
    (("h", "e", "h"), "no native reference: with MKL_ENABLE_INSTRUCTIONS=AVX2 the host "
                      "gives its own bits"),
])
def test_the_verdict_follows_the_digests(case, expected):
    """Equal bits are faithful only where the forced run differs from the host's own: a
    switch that changes nothing is no reference (the MKL case of an AMD host, where MKL
    under an emulated Haswell equalled the capped host at one shape and differed at the
    model's); a vendor-dependent kernel under another vendor's model is no reference
    either, equal or not."""
    from bitdrift.emulation.fidelity import judge

    native, emulated, host = case
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        found = judge("mkl_torch_sgemm", "EPYC-Rome-v2" if vendor == "AuthenticAMD"
                      else "Haswell-v4", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, native,
                      emulated, host, vendor)
        assert found.startswith(expected), (vendor, found)
    other = judge("mkl_torch_sgemm", "Haswell-v4", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                  native, emulated, host, "AuthenticAMD")
    assert other.startswith("no native reference"), other
    assert judge("mlas_onnxruntime_conv", "Haswell-v4", None, None, emulated, host,
                 "GenuineIntel") == ("equals the host's kernel" if emulated == host
                                     else "differs from the host's kernel")


def test_mkl_is_checked_at_the_default_models_shapes(tmp_path):
    """The MKL kernel runs the layers torch computes with MKL in cifar10_small at batch 1:
    its first convolution (the only one with 3 input channels and a 3x3 kernel) and its
    three Dense layers, read from the Keras model itself."""
    import keras

    from bitdrift.emulation.fidelity import MODEL_MKL_LAYERS
    from bitdrift.inputs.models import cifar10_small

    model = cifar10_small(keras, (32, 32, 3), 10)
    expected = []
    for layer in model.layers:
        if layer.name == "conv2d":
            height, width, channels, filters = layer.kernel.shape
            expected.append(("conv2d", (1, channels, *layer.input.shape[1:3]),
                             (filters, channels, height, width)))
        elif type(layer).__name__ == "Dense":
            inputs, units = layer.kernel.shape
            expected.append(("linear", (1, inputs), (units, inputs)))
    assert tuple(expected) == MODEL_MKL_LAYERS


def test_tensorflows_onednn_is_faithful_under_a_model_of_the_hosts_vendor():
    """TensorFlow's oneDNN follows the CPU's vendor, not only its instruction sets (an
    emulated Intel Haswell and an AMD host capped at AVX2 give other bits): the check
    compares it with the host forced to the class under a model of the host's own vendor,
    where it must be faithful on a host with AVX-512 (the AVX2 cap changes its kernel)
    and no native reference on one without (the cap changes nothing), and never calls the
    other vendor's model a mismatch."""
    from bitdrift.emulation.fidelity import check, host_vendor, model_vendor

    flags = _host_flags()
    if not {"avx2", "fma"} <= flags:
        pytest.fail("this test needs an AVX2 host (every CPU bitdrift's CI has run on has it)")
    same = next(model for model in ("Haswell-v4", "EPYC-Rome-v2")
                if model_vendor(model) == host_vendor())
    other = "EPYC-Rome-v2" if same == "Haswell-v4" else "Haswell-v4"
    rows = {row["emulated"]: row for row in check(["onednn_tensorflow_conv"], [same, other])}
    if "avx512f" in flags:
        assert rows[same]["verdict"] == "faithful", rows[same]
    else:
        assert rows[same]["verdict"].startswith("no native reference: with "
                                                "ONEDNN_MAX_CPU_ISA=AVX2"), rows[same]
    assert rows[other]["verdict"].startswith("no native reference"), rows[other]


def test_the_generations_grid_is_read_from_the_class_table():
    import pandas as pd

    from bitdrift.report.figures.machines import generations_grid

    eqc = pd.DataFrame({"device": ["t_h", "t_n", "o_h", "t_h", "t_n", "o_h"],
                        "sample": [0, 0, 0, 1, 1, 1], "eqc": [1, 2, 1, 1, 1, 2]})
    devices = {"t_h": ("torch", "host"), "t_n": ("torch", "Nehalem-v2"),
               "o_h": ("onnxruntime", "host"), "o_x": ("onnxruntime", "Nehalem-v2")}
    grid, rows, columns = generations_grid(eqc, devices)
    assert rows == ["torch", "onnxruntime"] and columns == ["host", "Nehalem-v2"]
    assert grid.loc["torch", "host"] == "1/1" and grid.loc["torch", "Nehalem-v2"] == "2/1"
    assert grid.loc["onnxruntime", "host"] == "1/2"
    assert grid.loc["onnxruntime", "Nehalem-v2"] == ""  # no record: cannot run


@pytest.mark.parametrize(("backend", "model", "why"), [
    ("tensorflow", "Nehalem-v2", "needs AVX"),  # TensorFlow's x86 wheel is built for AVX
    ("tensorflow", "SandyBridge-v2", None),
    ("onnxruntime", "Nehalem-v2", None),
    ("torch", "neoverse-n1", "not in the Arm userland"),
    ("onnxruntime", "neoverse-n1", None),
    ("litert", "a64fx", None),
])
def test_the_figure_says_why_a_runtime_has_no_cell_on_a_cpu(backend, model, why):
    """An empty cell of the generations figure names the reason, the same one the config
    check refuses such a device for."""
    from bitdrift.emulation.cpus import unavailable

    assert unavailable(backend, model) == why
    device = {"accelerator": "cpu", "backend": backend, "emulate": model}
    if why:
        with pytest.raises(ConfigError):
            check_device("d", device)
    else:
        check_device("d", device)
