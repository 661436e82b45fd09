#!/usr/bin/env python3
"""Build (or reuse) the llama-cpp-python wheel and fetch its server dependencies as wheels.

llama-cpp-python 0.3.36 exists on PyPI only as an sdist; compiling it takes 7-25 minutes
on two loaded cores. This script is idempotent:

* if `llama_cpp_python-0.3.36-*.whl` is in the wheel cache, it is reused, else it is
  built reproducibly (see build_wheel) from the sdist pinned by SHA-256, with the build
  tools pinned by hash in `scripts/llama-build-requirements.txt`, `nice`d, with
  `CMAKE_BUILD_PARALLEL_LEVEL=2` and a CPU-only, non-native build
  (`-DGGML_NATIVE=OFF`, AVX/AVX2/FMA/F16C on) so it runs on any x86-64-v3 host;
* the wheels of the `[server]` extra's dependencies are pinned by file name and SHA-256
  in `scripts/llama-server-wheels.sha256` (built for CPython 3.11 on manylinux x86_64:
  the Debian `/usr/bin/python3` that engine containers bind-mount); those missing from
  the cache are fetched with `pip download --require-hashes`, nothing when all are there.

Afterwards the engine image can be built offline from the cache
(`scripts/build_llama_image.py`). The wheel cache is --cache, else $ANVIL_WHEEL_CACHE,
else ~/.cache/anvil/wheels.

    build_llama_wheel.py            # reuse or build, then fetch missing dependency wheels
    build_llama_wheel.py --check    # exit 1 unless the wheel and every pinned wheel are there
    build_llama_wheel.py --relock   # re-resolve the [server] dependencies (needs PyPI) and
                                    # rewrite scripts/llama-server-wheels.sha256

The compiled wheel is reproducible: with Debian bookworm's gcc 12.2 and CMake 3.25 it
has the same bytes on every build (checked: three builds, in other caches, umasks and
working directories, one from a fresh clone with no cache), so the engine image ID the
recipes pin holds on a new machine of the same kind. A different compiler (another Debian
point release) may give other bytes, hence another image ID; recipes pinning the old one
are then refused and must be re-pinned.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

VERSION = "0.3.36"
REQUIREMENT = f"llama-cpp-python=={VERSION}"
WHEEL_GLOB = f"llama_cpp_python-{VERSION}-*.whl"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
SOURCE_DATE_EPOCH = "1704067200"  # 2024-01-01T00:00:00Z
BUILD_ROOT = Path("/tmp/anvil-llama-build")  # fixed: the build's paths end up in its bytes
UNIMPORTED_TOPS = ("include", "lib", "bin")
LOCK = Path(__file__).resolve().parent / "llama-server-wheels.sha256"
BUILD_TOOLS = Path(__file__).resolve().parent / "llama-build-requirements.txt"
# The interpreter the wheels are for: Debian bookworm's python3 (3.11), bind-mounted into
# engine containers. Given explicitly so any host Python can fetch them.
TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3"]
TARGET += ["--abi", "none"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64"]
PLATFORMS += ["manylinux2014_x86_64", "linux_x86_64"]
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def log(msg: str) -> None:
    print(f"build_llama_wheel: {msg}", file=sys.stderr)


def default_cache() -> Path:
    env = os.environ.get("ANVIL_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "anvil" / "wheels"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_lock(lock: Path = LOCK) -> list[tuple[str, str]]:
    """(sha256, file name) of every pinned dependency wheel, in file order."""
    out = []
    for raw in lock.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        digest, name = line.split()
        out.append((digest, name))
    return out


def llama_wheels(cache: Path) -> list[Path]:
    return sorted(cache.glob(WHEEL_GLOB))


def missing_deps(cache: Path) -> list[tuple[str, str]]:
    """Pinned wheels absent from the cache or whose bytes differ from the pin."""
    missing = []
    for digest, name in read_lock():
        path = cache / name
        if not path.is_file() or sha256_file(path) != digest:
            missing.append((digest, name))
    return missing


def build_wheel(cache: Path) -> Path:
    """Compile the wheel from the pinned sdist into the cache; the file appears only when complete.

    Reproducible: the same sdist, build tools, compiler and flags give the same bytes on
    every run and machine. What would vary is fixed: the source and build trees are always
    BUILD_ROOT (llama.cpp's assertion messages embed `__FILE__`), the build tools come from
    a hash-pinned venv instead of an isolated build env resolved afresh, the CMake generator
    is named (a host with ninja would otherwise get a different build), SOURCE_DATE_EPOCH
    fixes every timestamp, and the wheel is repacked without the trees no import reaches
    (`include/`, `lib/`, `bin/`: headers, CMake and pkg-config files, which embed the random
    staging directory scikit-build-core installs into, and a second copy of the libraries).
    """
    with _exclusive(BUILD_ROOT.with_name(BUILD_ROOT.name + ".lock")):
        if built := llama_wheels(cache):  # by the run that held the lock while this one waited
            log(f"built meanwhile by another run: {built[0]}")
            return built[0]
        shutil.rmtree(BUILD_ROOT, ignore_errors=True)
        BUILD_ROOT.mkdir(parents=True)
        sdist = fetch_sdist(cache)
        with tarfile.open(sdist) as tf:
            tf.extractall(BUILD_ROOT, filter="data")
        src = BUILD_ROOT / f"llama_cpp_python-{VERSION}"
        venv = BUILD_ROOT / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", "--no-deps", "--require-hashes", "-r", str(BUILD_TOOLS)], check=True)
        env = _build_env()
        cmd = ["nice", "-n", "10", *pip, "wheel", "--no-deps", "--no-build-isolation"]
        cmd += ["-C", f"build-dir={BUILD_ROOT / 'build'}", "-w", str(BUILD_ROOT / "out"), str(src)]
        log(f"building {REQUIREMENT} in {BUILD_ROOT} (CMAKE_ARGS={CMAKE_ARGS}); this takes minutes")
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, env=env)
        built = sorted((BUILD_ROOT / "out").glob(WHEEL_GLOB))
        if len(built) != 1:
            raise SystemExit(
                f"build_llama_wheel: expected one {WHEEL_GLOB} in {BUILD_ROOT / 'out'}, got {built}"
            )
        final = _repack(py, built[0], env)
        target = cache / final.name
        _copy(final, target)
        log(f"built {target.name} in {time.monotonic() - t0:.0f}s; SHA-256 {sha256_file(target)}")
        shutil.rmtree(BUILD_ROOT, ignore_errors=True)
        return target


def _build_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CMAKE_", "PIP_", "MAKE"))}
    env |= {"CFLAGS": "", "CXXFLAGS": "", "LDFLAGS": "", "CPPFLAGS": ""}
    env |= {
        "CMAKE_ARGS": CMAKE_ARGS,
        "CMAKE_GENERATOR": "Unix Makefiles",
        "CMAKE_BUILD_PARALLEL_LEVEL": "2",
        "FORCE_CMAKE": "1",
        "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
        "LC_ALL": "C",
        "TZ": "UTC",
    }
    return env


def _repack(py: str, wheel: Path, env: dict[str, str]) -> Path:
    """The wheel without its unimported top-level trees, repacked with fixed timestamps."""
    unpacked = BUILD_ROOT / "unpacked"
    subprocess.run([py, "-m", "wheel", "unpack", "-d", str(unpacked), str(wheel)], check=True, env=env)
    (tree,) = unpacked.iterdir()
    for top in UNIMPORTED_TOPS:
        shutil.rmtree(tree / top, ignore_errors=True)
    for path in tree.rglob("*"):  # modes as a umask of 022 leaves them, whatever this one is
        if path.is_file():
            path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)
    out = BUILD_ROOT / "final"
    out.mkdir()
    subprocess.run([py, "-m", "wheel", "pack", "-d", str(out), str(tree)], check=True, env=env)
    (final,) = out.glob(WHEEL_GLOB)
    return final


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist, from the cache or downloaded by version and SHA-256."""
    path = cache / SDIST
    if not (path.is_file() and sha256_file(path) == SDIST_SHA256):
        _download(
            cache,
            [(f"{REQUIREMENT} --hash=sha256:{SDIST_SHA256}", SDIST_SHA256, SDIST)],
            ["--no-binary", ":all:"],
        )
    return path


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """One build at a time on this host: they share BUILD_ROOT."""
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _copy(src: Path, dst: Path) -> None:
    partial = dst.with_name(dst.name + ".partial")
    with src.open("rb") as fi, partial.open("wb") as fo:
        while chunk := fi.read(1 << 20):
            fo.write(chunk)
    os.replace(partial, dst)


def _requirement(digest: str, name: str) -> str:
    m = _WHEEL_RE.match(name)
    if not m:
        raise SystemExit(f"build_llama_wheel: {LOCK}: {name!r} is not a wheel file name")
    return f"{m['name']}=={m['version']} --hash=sha256:{digest}"


def fetch_deps(cache: Path, missing: list[tuple[str, str]]) -> None:
    """pip download the missing pinned wheels (by version and hash) into the cache."""
    options = ["--only-binary=:all:", *TARGET]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    _download(cache, [(_requirement(d, n), d, n) for d, n in missing], options)
    log(f"fetched {len(missing)} dependency wheel(s) into {cache}")


def _download(cache: Path, pins: list[tuple[str, str, str]], options: list[str]) -> None:
    """`pip download --require-hashes` of (requirement line, SHA-256, file name) pins into the
    cache, each checked by its SHA-256 before it is copied there."""
    with tempfile.TemporaryDirectory(prefix="anvil-llama-download-") as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("".join(line + "\n" for line, _, _ in pins))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes"]
        cmd += ["--disable-pip-version-check", "-q", "-d", tmp, *options, "-r", str(reqs)]
        subprocess.run(cmd, check=True)
        for _, digest, name in pins:
            got = Path(tmp) / name
            if not got.is_file() or sha256_file(got) != digest:
                raise SystemExit(f"build_llama_wheel: pip download did not give {name} ({digest})")
            _copy(got, cache / name)


def relock(cache: Path, wheel: Path) -> None:
    """Resolve `llama-cpp-python[server]` against the index and pin every dependency wheel."""
    with tempfile.TemporaryDirectory(prefix="anvil-llama-relock-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--find-links", str(cache)]
        cmd += ["--disable-pip-version-check", "-q", "-d", tmp, *TARGET]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        subprocess.run([*cmd, f"llama-cpp-python[server]=={VERSION}"], check=True)
        lines = [
            "# Wheels of llama-cpp-python[server]==0.3.36's dependencies for CPython 3.11,",
            "# manylinux x86_64: `sha256  file name`, as `sha256sum -c` reads it.",
            "# Written by scripts/build_llama_wheel.py --relock; the engine image holds exactly these.",
        ]
        for path in sorted(Path(tmp).glob("*.whl")):
            if path.name == wheel.name:
                continue
            lines.append(f"{sha256_file(path)}  {path.name}")
            _copy(path, cache / path.name)
        LOCK.write_text("\n".join(lines) + "\n")
    log(f"wrote {LOCK} ({len(lines) - 3} wheels)")


def check_wheel(wheel: Path) -> None:
    """The wheel is a readable zip holding the llama_cpp package and its shared library."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        bad = zf.testzip()
    if bad is not None or "llama_cpp/__init__.py" not in names or "llama_cpp/lib/libllama.so" not in names:
        raise SystemExit(f"build_llama_wheel: {wheel} is not a complete llama-cpp-python wheel")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", type=Path, default=None, help="wheel cache directory")
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if anything is missing")
    parser.add_argument("--relock", action="store_true", help="re-resolve and rewrite the pin file")
    args = parser.parse_args(argv)
    cache = (args.cache or default_cache()).absolute()
    wheels = llama_wheels(cache)
    if len(wheels) > 1:
        log(f"several {WHEEL_GLOB} in {cache}: {[w.name for w in wheels]}; keep one")
        return 1
    if args.check:
        missing = missing_deps(cache)
        for _, name in missing:
            log(f"missing or altered: {cache / name}")
        if not wheels:
            log(f"missing: {cache / WHEEL_GLOB}")
        return 1 if missing or not wheels else 0
    cache.mkdir(parents=True, exist_ok=True)
    if wheels:
        wheel = wheels[0]
        log(f"reusing {wheel}")
    else:
        wheel = build_wheel(cache)
    check_wheel(wheel)
    if args.relock:
        relock(cache, wheel)
    missing = missing_deps(cache)
    if missing:
        fetch_deps(cache, missing)
    else:
        log(f"all {len(read_lock())} pinned dependency wheels present in {cache}")
    print(f"{sha256_file(wheel)}  {wheel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
