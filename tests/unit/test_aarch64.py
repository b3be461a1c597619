"""Emulated Arm CPUs: the userland bitdrift.emulation.aarch64 builds (a Debian arm64 root, aarch64
wheels), the refusals of a device that cannot run, and real LiteRT and ONNX Runtime runs
under qemu-aarch64 checked against the host's records of the same runtime."""

import json
import os
import subprocess

import numpy as np
import pytest

from bitdrift.emulation import aarch64
from bitdrift.emulation.cpus import ARM_FAMILIES, environment, python_command
from bitdrift.errors import InferenceError, InstallError

INDEX = """Package: python3.11-minimal
Pre-Depends: libc6 (>= 2.36)
Depends: libpython3.11-minimal (= 3.11.2-6), libexpat1 (>= 2.1~beta3), zlib1g (>= 1:1.2.0)

Package: libpython3.11-minimal
Depends: libc6 (>= 2.34)

Package: libexpat1
Depends: libc6:arm64 (>= 2.25)

Package: zlib1g
Depends: libc6 | libc6.1

Package: libc6
Depends: libgcc-s1

Package: libgcc-s1
Depends: gcc-12-base (= 12.2.0-14), libc6 (>= 2.35)

Package: gcc-12-base

Package: libpython3.11-stdlib
Depends: media-types | mime-support, tzdata, libffi8 (>= 3.4), libpython3.11-minimal

Package: media-types

Package: tzdata

Package: libffi-impl
Provides: libffi8 (= 3.4.4)
Depends: libc6

Package: libc6.1
"""


def test_the_root_is_resolved_from_a_debian_index_by_hand():
    """Pre-Depends and Depends, the first of alternatives, a virtual package through its
    provider, an architecture qualifier; what a python-only root never runs (tzdata,
    media-types) left out. The expected set is read off INDEX by hand."""
    index = aarch64.parse_index(INDEX)
    found = {fields["Package"] for fields in aarch64.resolve(
        index, ("python3.11-minimal", "libpython3.11-stdlib"))}
    assert found == {"python3.11-minimal", "libpython3.11-minimal", "libexpat1", "zlib1g",
                     "libc6", "libgcc-s1", "gcc-12-base", "libpython3.11-stdlib",
                     "libffi-impl"}


def test_a_package_the_index_lacks_is_named():
    index = aarch64.parse_index(INDEX + "\nPackage: broken\nDepends: not-there\n")
    with pytest.raises(InstallError, match="arm64 index has no 'not-there'"):
        aarch64.resolve(index, ("broken",))


def _hand_built_site(site):
    """A small site of wheels' files: a module, an executable, a library link, a folder
    link (pip's layout); {path: bytes} of its files, read back by the test as the truth."""
    (site / "pkg" / "libs").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (site / "pkg" / "libs" / "libx.so.1").write_bytes(bytes(range(256)) * 40)
    (site / "pkg" / "libs" / "libx.so").symlink_to("libx.so.1")
    (site / "bin").mkdir()
    (site / "bin" / "tool").write_text("#!/bin/sh\n")
    (site / "bin" / "tool").chmod(0o755)
    (site / "pkg-1.0.dist-info").mkdir()
    (site / "pkg-1.0.dist-info" / "RECORD").write_text("pkg/__init__.py,,\n")
    (site / "alias").symlink_to("pkg", target_is_directory=True)


def _tree(site):
    """{path: bytes, or the target of a link} and the executable files of ``site``."""
    tree, executable = {}, set()
    for top, folders, names in os.walk(site):
        for name in (*names, *folders):
            path = os.path.join(top, name)
            relative = os.path.relpath(path, site)
            if os.path.islink(path):
                tree[relative] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                tree[relative] = open(path, "rb").read()
                if os.access(path, os.X_OK):
                    executable.add(relative)
    return tree, executable


PINS = {"wheels": ["numpy==2.0.0"], "runtimes": ["onnxruntime"], "platforms": ["x"],
        "python": "cp311"}


def test_a_built_site_is_kept_and_taken_back_by_the_same_pins_only(tmp_path, monkeypatch,
                                                                  capsys):
    """A site kept in the user's cache (XDG_CACHE_HOME) comes back file for file, links as
    links, executables executable; other pins find nothing. The SHA-256 each file is kept
    with is the one hashlib gives its bytes."""
    import hashlib

    from bitdrift.emulation import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _hand_built_site(tmp_path / "built")
    truth = _tree(tmp_path / "built")
    entry = cache.keep_site(PINS, tmp_path / "built")
    assert entry.parent.parent == tmp_path / "cache" / "bitdrift"
    kept = json.loads((entry / cache.HASHES).read_text())
    assert kept["files"]["pkg/libs/libx.so.1"] == hashlib.sha256(
        bytes(range(256)) * 40).hexdigest()
    assert kept["files"]["alias"] == "-> pkg"
    assert cache.take_site(PINS, tmp_path / "taken") == entry
    assert _tree(tmp_path / "taken") == truth
    assert (tmp_path / "taken" / "alias").is_symlink()
    assert cache.take_site({**PINS, "wheels": ["numpy==2.0.1"]}, tmp_path / "other") is None
    assert not (tmp_path / "other").exists()
    assert capsys.readouterr().err == ""


DAMAGES = {
    "a changed byte": lambda entry: _change_byte(entry / "site" / "pkg" / "libs" / "libx.so.1"),
    "a file removed": lambda entry: (entry / "site" / "bin" / "tool").unlink(),
    "a file added": lambda entry: (entry / "site" / "pkg" / "extra.py").write_text(""),
    "a link retargeted": lambda entry: _retarget(entry / "site" / "pkg" / "libs" / "libx.so"),
    "its hashes unreadable": lambda entry: (entry / "hashes.json").write_text("{"),
}


def _change_byte(path, offset=1000):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\xff")


def _retarget(link):
    link.unlink()
    link.symlink_to("__init__.py")


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_cached_site_is_said_in_one_line_and_built_anew(tmp_path, monkeypatch,
                                                                  capsys, damage):
    """A kept site whose bytes, files, links or record changed since is not taken: one line
    names the entry and what is wrong, the entry is removed (the next build keeps a new
    one) and nothing is left where the site goes."""
    from bitdrift.emulation import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _hand_built_site(tmp_path / "built")
    entry = cache.keep_site(PINS, tmp_path / "built")
    DAMAGES[damage](entry)
    assert cache.take_site(PINS, tmp_path / "taken") is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"bitdrift: the cached aarch64 site {entry} is damaged (")
    assert line.endswith("); building it anew")
    assert not entry.exists() and not (tmp_path / "taken").exists()


def test_debian_packages_are_kept_by_their_sha256_and_a_damaged_one_fetched_again(
        tmp_path, monkeypatch, capsys):
    """A package fetched once comes from the cache while it matches the SHA-256 the index
    gives (the mirror's copy gone meanwhile); one damaged since is said in one line and
    fetched again; a download that does not match is refused and not kept."""
    import hashlib

    from bitdrift.emulation import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    payload = b"!<arch>\n" + bytes(range(200))
    sha256 = hashlib.sha256(payload).hexdigest()
    mirror = tmp_path / "mirror.deb"
    mirror.write_bytes(payload)
    url = f"file://{mirror}"
    assert cache.fetch_deb(url, sha256, "install-aarch64") == payload
    mirror.unlink()
    assert cache.fetch_deb(url, sha256, "install-aarch64") == payload
    kept = tmp_path / "cache" / "bitdrift" / "debs" / sha256[:2] / f"{sha256}.deb"
    _change_byte(kept, 10)
    with pytest.raises(InstallError, match=f"cannot fetch {url}"):
        cache.fetch_deb(url, sha256, "install-aarch64")
    assert capsys.readouterr().err.splitlines() == [
        f"bitdrift: the cached {kept} does not match its SHA-256 (damaged); fetching it again"]
    mirror.write_bytes(payload[:-1] + b"x")
    with pytest.raises(InstallError, match=f"install-aarch64: {url} does not match the "
                                           "SHA-256 of its index"):
        cache.fetch_deb(url, sha256, "install-aarch64")
    assert not kept.exists() and not list(kept.parent.iterdir())
    mirror.write_bytes(payload)
    assert cache.fetch_deb(url, sha256, "install-aarch64") == payload
    assert kept.read_bytes() == payload


def _stand_in_qemu(folder, version):
    (folder / "bin").mkdir(parents=True)
    qemu = folder / "bin" / "qemu-aarch64"
    qemu.write_text(f"#!/bin/sh\necho 'qemu-aarch64 version {version}'\n")
    qemu.chmod(0o755)


def _stand_in_userland(built):
    """The files of a built userland that are looked for before a run (its python, its
    site), empty: nothing here runs under QEMU."""
    (built / "root" / aarch64.PYTHON).parent.mkdir(parents=True)
    (built / "root" / aarch64.PYTHON).write_text("")
    (built / "site").mkdir()


def test_an_arm_device_refuses_qemu_older_than_8_and_a_missing_userland(tmp_path,
                                                                        monkeypatch):
    """QEMU 7.2 crashes in LiteRT and ONNX Runtime: an Arm device needs 10 or newer, and
    the userland; each refusal is one line naming `bitdrift install-aarch64`. (The
    emulator here is a stand-in script that only answers --version.)"""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("sys.prefix", str(tmp_path / "old"))
    _stand_in_qemu(tmp_path / "old", "7.2.22 (Debian 1:7.2+dfsg-7+deb12u16)")
    with pytest.raises(InferenceError, match="needs QEMU 10 or newer .*7.2.22.*install-aarch64"):
        python_command({"emulate": "neoverse-n1"})
    monkeypatch.setattr("sys.prefix", str(tmp_path / "new"))
    _stand_in_qemu(tmp_path / "new", "10.0.13 (Debian 1:10.0.13+ds-0+deb13u1)")
    with pytest.raises(InferenceError, match="aarch64 userland that is not built .*"
                                             "install-aarch64"):
        python_command({"emulate": "neoverse-n1"})


def test_an_arm_device_refuses_a_userland_of_other_versions_or_runtimes(tmp_path,
                                                                         monkeypatch):
    """A userland built for another release of a wheel (the host upgraded since) or
    without the device's runtime is refused, naming what changed; a folder without its
    manifest (a build cut off) counts as not built. Manifests written by hand."""
    from importlib import metadata

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("sys.prefix", str(tmp_path))
    _stand_in_qemu(tmp_path, "10.0.13 (Debian 1:10.0.13+ds-0+deb13u1)")
    built = aarch64.folder()
    _stand_in_userland(built)
    assert aarch64.installed() is None
    numpy_now = f"numpy=={metadata.version('numpy')}"
    pins = aarch64.requirements(("onnxruntime",))
    assert numpy_now in pins
    (built / "manifest.json").write_text(json.dumps({
        "runtimes": ["onnxruntime"],
        "wheels": [p if p != numpy_now else "numpy==1.0.0" for p in pins]}))
    device = {"emulate": "neoverse-n1", "backend": "onnxruntime"}
    with pytest.raises(InferenceError, match=f"other versions .*numpy==1.0.0 -> "
                                             f"{numpy_now}.*install-aarch64"):
        python_command(device)
    (built / "manifest.json").write_text(json.dumps({"runtimes": ["onnxruntime"],
                                                     "wheels": pins}))
    assert python_command(device)[-1].endswith("root/usr/bin/python3.11")
    with pytest.raises(InferenceError, match="holds onnxruntime, not litert.*install-aarch64"):
        python_command({**device, "backend": "litert"})


def test_the_arm_wheels_are_pinned_to_the_hosts_releases():
    """Each aarch64 wheel at the version this environment runs, read from its metadata;
    TensorFlow's at the host's tensorflow-cpu (the x86 CPU-only build of the same
    release); a runtime without an aarch64 build is refused by name."""
    from importlib import metadata

    pins = aarch64.requirements(("tensorflow", "jax"))
    assert f"tensorflow=={metadata.version('tensorflow-cpu')}" in pins
    assert f"jaxlib=={metadata.version('jaxlib')}" in pins
    assert pins.count(f"keras=={metadata.version('keras')}") == 1  # both runtimes need it
    with pytest.raises(InstallError, match="no aarch64 build of torch"):
        aarch64.install(runtimes=("torch",))


@pytest.fixture(scope="module")
def userland():
    """The environment's aarch64 userland, built by the project's own installer if this
    environment has none yet (QEMU 10 from Debian, arm64 packages, wheels from PyPI)."""
    return aarch64.install(force=False, runtimes=tuple(aarch64.RUNTIMES))


@pytest.mark.parametrize("model", ["cortex-a57", "neoverse-n1", "a64fx", "neoverse-v1"])
def test_the_instruction_sets_of_an_arm_model_are_what_qemu_shows(userland, model):
    """The table the figure orders by and the findings name, against the features the
    emulated process reads (QEMU's /proc/cpuinfo for aarch64)."""
    device = {"emulate": model}
    code = ("import json, platform; from bitdrift.emulation.cpus import seen_cpu; "
            "print(json.dumps({**seen_cpu(), 'machine': platform.machine()}))")
    done = subprocess.run([*python_command(device), "-c", code], capture_output=True,
                          text=True, env={**os.environ, **environment(device)},
                          check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["machine"] == "aarch64"
    for name in ("asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm"):
        assert (name in seen["flags"]) == (name in ARM_FAMILIES[model]), (model, name)


@pytest.fixture(scope="module")
def exported(small_export_copy, tmp_path_factory):
    folder = tmp_path_factory.mktemp("arm")
    dataset, model, reference = small_export_copy(folder)
    return folder, dataset, model, reference


CPU = {"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float32",
       "env": {}, "repeats": 1, "external": False}
SAMPLES = [0, 6]


# JAX's traced repeat compiles every layer anew (bitdrift.backends.keras.jax.trace_layers),
# which under QEMU took about 7 of this test's 15 minutes on a 2-core Xeon; JAX's traced
# repeat is tested on the host (tests/unit/test_kernels.py), so on Arm JAX's layers and
# fingerprint are checked without it
UNTRACED_ON_ARM = {"jax"}


def _record(exported, tmp_path, name, device, kernels=True):
    from bitdrift.record.reader import Record
    from bitdrift.run.inference import infer
    from tests.utils import EXPORT_FILES

    folder, dataset, model, reference = exported
    out = tmp_path / f"{name}.h5"
    with open(tmp_path / f"{name}.log", "w") as log:
        infer(model_name="small", device_name=name, device={**CPU, **device},
              model_path=model, dataset_path=dataset, samples=SAMPLES, out=out, log=log,
              reference=reference, export=folder / EXPORT_FILES[device["backend"]]
              if device["backend"] in EXPORT_FILES else None, kernels=kernels)
    with Record(out) as record:
        values = {(sample, info.label): record.tensor(sample, info).values
                  for sample in SAMPLES for info in record.layers(sample)}
        return values, record.fingerprint, record.accumulation_orders


@pytest.mark.parametrize("backend", sorted(aarch64.RUNTIMES))
def test_a_runtime_runs_on_an_emulated_arm_cpu(userland, exported, tmp_path, backend):
    """Each runtime of the Arm userland on an emulated Neoverse-N1: every layer the host's
    record of the same runtime has, with values within float32 rounding of the host's
    (the Arm wheel maps the same layers); the fingerprint is the Arm CPU the process saw,
    QEMU's version and the host; the Dense layers' summation order is revealed on the Arm
    CPU (LiteRT's layers converted by the host's python)."""
    from bitdrift.report.findings.machine import emulated

    # OpenVINO's default precision follows the CPU (bfloat16 on a host with native bf16,
    # float16 on Arm): float32 asked for on both sides
    settings = {"backend": backend, **({"inference_precision_hint": "f32"}
                                       if backend == "openvino" else {})}
    traced = backend not in UNTRACED_ON_ARM
    arm, fingerprint, orders = _record(exported, tmp_path, "arm",
                                       {**settings, "emulate": "neoverse-n1"}, traced)
    host, _, _ = _record(exported, tmp_path, "host", settings, traced)
    assert arm.keys() == host.keys()
    for key, values in arm.items():
        np.testing.assert_allclose(values, host[key], rtol=1e-4, atol=1e-5, err_msg=str(key))
    assert fingerprint["cpu"]["arch"] == "AARCH64"
    assert fingerprint["cpu"]["brand"] == "Arm Neoverse-N1"
    assert fingerprint["emulation"]["model"] == "neoverse-n1"
    assert aarch64.version_tuple(fingerprint["emulation"]["qemu"]) >= aarch64.LEAST_QEMU
    assert fingerprint["emulation"]["host_flags"]
    dense = [layer for layer in orders or {} if layer.startswith("dense")]
    assert (dense and all(orders[layer].get("order") for layer in dense)) if traced \
        else not orders, orders
    (line,) = emulated({"arm": fingerprint})
    assert "as neoverse-n1 (Arm Neoverse-N1; it saw NEON, FP16, DOTPROD)" in line


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("emulate", [None, "neoverse-n1"])
def test_a_killed_job_leaves_no_worker_behind(userland, exported, tmp_path, emulate):
    """SIGKILL cannot be handled: a job's worker (a fresh ONNX Runtime process, natively or
    under qemu-aarch64) must die with the job, never compute on as an orphan."""
    import signal
    import sys
    import time

    from tests.utils import EXPORT_FILES

    folder, dataset, model, reference = exported
    device = {**CPU, "backend": "onnxruntime", "repeats": 50,
              **({"emulate": emulate} if emulate else {})}
    code = (f"from bitdrift.run.inference import infer\n"
            f"infer(model_name='small', device_name='k', device={device!r}, "
            f"model_path={str(model)!r}, dataset_path={str(dataset)!r}, samples={SAMPLES}, "
            f"out={str(tmp_path / 'k.h5')!r}, log=open({str(tmp_path / 'k.log')!r}, 'w'), "
            f"reference={str(reference)!r}, "
            f"export={str(folder / EXPORT_FILES['onnxruntime'])!r})\n")
    job = subprocess.Popen([sys.executable, "-c", code])

    def workers():  # the job's worker processes now (not a `qemu --version` probe)
        return [pid for pid in _children(job.pid) if _alive(pid) and b"bitdrift.run.repeat"
                in open(f"/proc/{pid}/cmdline", "rb").read()]

    deadline, found, running = time.monotonic() + 120, [], []
    while time.monotonic() < deadline and job.poll() is None:
        running = workers()
        found += [pid for pid in running if pid not in found]
        if len(found) >= 2 and running:  # the job is under way and a worker is running
            break
        time.sleep(0.1)
    job.send_signal(signal.SIGKILL)
    assert len(found) >= 2 and running, f"no worker was running when the job was killed " \
                                        f"({len(found)} seen)"
    workers = running
    job.wait()
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)
