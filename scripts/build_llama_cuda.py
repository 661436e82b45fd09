#!/usr/bin/env python3
"""The llama.cpp engine for CUDA: its source, its wheel and its image, on a host with a GPU.

The same pinned llama-cpp-python sdist as the CPU engine (build_llama_wheel.py's
SDIST_SHA256), compiled with `-DGGML_CUDA=on` for one CUDA architecture only (the GPU's,
so the build fits one short session), and an image in the CPU engine's format
(build_llama_image.py) whose `llama_cpp/lib` also holds the CUDA runtime libraries the
build linked (libcudart, libcublas, libcublasLt: found through `ldd`, copied beside
libggml-cuda.so, whose RUNPATH is $ORIGIN). The driver's own libraries (libcuda,
libnvidia-ml) are never in the image: they belong to the host's kernel driver, and the
container gets them from the host (docs/ENGINES.md, "GPU engines in Docker").

    build_llama_cuda.py trim SDIST OUT.tar.gz       # here: the sdist less what no build reads
    build_llama_cuda.py wheel SRC.tar.gz --arch 90  # GPU host: compile; prints the wheel's path
    build_llama_cuda.py image WHEEL --deps DIR      # GPU host: the image tarball; --load loads it

`trim` exists because a GPU machine may take files in parts of 64 MiB: it verifies the
sdist's SHA-256, drops the vocabulary models, the docs, the web UI, the benchmarks and the
ggml backends other than CPU and CUDA (none is read by a CUDA build), and writes a tarball
with fixed names, times and owners; `wheel` takes the sdist or such a tarball. The
`--deps` directory holds the `[server]` dependency wheels for the host's Python (the
container runs the host's /usr/bin/python3); each is recorded by SHA-256 in the image's
MANIFEST.json. Standard library only (the GPU host has no package registry).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_llama_image import Wheel, build_tarball, load
from build_llama_wheel import SDIST_SHA256, SOURCE_DATE_EPOCH, VERSION, WHEEL_GLOB, sha256_file

ROOT = f"llama_cpp_python-{VERSION}"
DROPPED = (
    "docs",
    "vendor/llama.cpp/docs",
    "vendor/llama.cpp/models",
    "vendor/llama.cpp/tools/ui",
    "vendor/llama.cpp/benches",
    *(
        f"vendor/llama.cpp/ggml/src/ggml-{b}"
        for b in (
            *("metal", "sycl", "vulkan", "opencl", "hexagon", "et"),
            *("cann", "webgpu", "zdnn", "zendnn", "openvino", "virtgpu"),
        )
    ),
)
"""Trees of the sdist that a CUDA build on Linux never reads (relative to its root)."""
CUDA_RUNTIME = re.compile(r"^(libcudart|libcublas|libcublasLt)\.so\.\d+$")
"""The CUDA toolkit's libraries that libggml-cuda.so links, copied into the image."""
BUILD_ROOT = Path("/tmp/anvil-llama-cuda-build")


def log(msg: str) -> None:
    print(f"build_llama_cuda: {msg}", file=sys.stderr, flush=True)


def trim(sdist: Path, out: Path) -> str:
    """Write the trimmed source tarball; return its SHA-256."""
    got = sha256_file(sdist)
    if got != SDIST_SHA256:
        raise SystemExit(f"build_llama_cuda: {sdist}: SHA-256 {got}, pinned {SDIST_SHA256}")
    dropped = tuple(f"{ROOT}/{d}" for d in DROPPED)
    with (
        tarfile.open(sdist) as src,
        out.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=int(SOURCE_DATE_EPOCH)) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for member in sorted(src.getmembers(), key=lambda m: m.name):
            if any(member.name == d or member.name.startswith(d + "/") for d in dropped):
                continue
            member.mtime = int(SOURCE_DATE_EPOCH)
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            data = src.extractfile(member) if member.isfile() else None
            dst.addfile(member, data)
    digest = sha256_file(out)
    log(f"{out}: {out.stat().st_size / 2**20:.1f} MiB, SHA-256 {digest} (from {sdist.name} {got})")
    return digest


def cuda_env(arch: str, jobs: int) -> dict[str, str]:
    """The build's environment: CUDA for one architecture, Ninja, fixed timestamps."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("build_llama_cuda: nvcc is not on PATH")
    args = [
        "-DGGML_CUDA=on",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DCUDAToolkit_ROOT={Path(nvcc).resolve().parent.parent}",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CMAKE_", "PIP_"))}
    env |= {
        "CMAKE_ARGS": " ".join(args),
        "CMAKE_GENERATOR": "Ninja",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
        "FORCE_CMAKE": "1",
        "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
        "LC_ALL": "C",
        "TZ": "UTC",
    }
    return env


def build_wheel(source: Path, arch: str, out_dir: Path, jobs: int) -> Path:
    """Compile the wheel from the sdist (or a trimmed copy) with pip; no build isolation."""
    shutil.rmtree(BUILD_ROOT, ignore_errors=True)
    BUILD_ROOT.mkdir(parents=True)
    with tarfile.open(source) as tf:
        tf.extractall(BUILD_ROOT, filter="data")
    src = BUILD_ROOT / ROOT
    env = cuda_env(arch, jobs)
    log(f"CMAKE_ARGS={env['CMAKE_ARGS']}")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    cmd += ["--disable-pip-version-check", "-C", f"build-dir={BUILD_ROOT / 'build'}"]
    cmd += ["-w", str(BUILD_ROOT / "out"), str(src)]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=env)
    (built,) = (BUILD_ROOT / "out").glob(WHEEL_GLOB)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / built.name.replace("-linux_", "-cuda" + arch + "_linux_", 1)
    _repack(built, final)
    log(f"built {final.name} in {time.monotonic() - t0:.0f} s; SHA-256 {sha256_file(final)}")
    return final


def _repack(wheel: Path, final: Path) -> None:
    """The wheel without include/, lib/ and bin/ (a second copy of the libraries, headers)."""
    import zipfile

    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(final, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in sorted(src.infolist(), key=lambda i: i.filename):
            if info.filename.startswith(("include/", "lib/", "bin/")):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [
                    line
                    for line in data.decode().splitlines()
                    if not line.startswith(("include/", "lib/", "bin/"))
                ]
                data = ("\n".join(kept) + "\n").encode()
            fixed = zipfile.ZipInfo(info.filename, date_time=(2024, 1, 1, 0, 0, 0))
            fixed.external_attr = info.external_attr
            fixed.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(fixed, data)


def cuda_libraries(wheel: Path) -> dict[str, Path]:
    """The CUDA runtime libraries libggml-cuda.so resolves to on this host, by soname."""
    import zipfile

    probe = BUILD_ROOT / "probe"
    shutil.rmtree(probe, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("llama_cpp/lib/")]
        zf.extractall(probe, members)
    found: dict[str, Path] = {}
    for lib in sorted((probe / "llama_cpp" / "lib").glob("libggml-cuda.so*")):
        out = subprocess.run(["ldd", str(lib)], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            name, _, rest = line.strip().partition(" => ")
            path = rest.split(" (")[0].strip()
            if CUDA_RUNTIME.match(name):
                if not path or path == "not found":
                    raise SystemExit(
                        f"build_llama_cuda: {lib.name} needs {name}, not found (LD_LIBRARY_PATH?)"
                    )
                found[name] = Path(path).resolve()
    if not found:
        raise SystemExit(f"build_llama_cuda: {wheel.name} holds no libggml-cuda.so linking CUDA's runtime")
    return found


def build_image(wheel: Path, deps: Path, out: Path) -> str:
    """The engine image tarball (docker-save format) at `out`; returns the image ID."""
    wheels = [Wheel(p, sha256_file(p)) for p in sorted([wheel, *deps.glob("*.whl")])]
    libs = cuda_libraries(wheel)
    extra = {f"llama_cpp/lib/{soname}": path for soname, path in libs.items()}
    for soname, path in libs.items():
        log(f"{soname}: {path} ({path.stat().st_size / 2**20:.0f} MiB, SHA-256 {sha256_file(path)})")
    python = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return build_tarball(
        wheels,
        out,
        extra_files=extra,
        python=f"/usr/bin/python3 (host, bind-mounted read-only; CPython {python})",
        variant=f"cuda: {wheel.name}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("trim", help="verify the sdist and write the trimmed source tarball")
    p.add_argument("sdist", type=Path)
    p.add_argument("out", type=Path)
    p = sub.add_parser("wheel", help="compile the CUDA wheel (on the GPU host)")
    p.add_argument("source", type=Path, help="the sdist or its trimmed tarball")
    p.add_argument("--sha256", help="the tarball's expected SHA-256 (trim prints it)")
    p.add_argument("--arch", required=True, help="CUDA architecture, e.g. 90 for an H100/H200")
    p.add_argument("--out", type=Path, default=Path("wheels"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p = sub.add_parser("image", help="build the image tarball from the CUDA wheel (on the GPU host)")
    p.add_argument("wheel", type=Path)
    p.add_argument("--deps", type=Path, required=True, help="the [server] dependency wheels")
    p.add_argument("--out", type=Path, default=Path("anvil-llama-cuda.tar"))
    p.add_argument("--load", action="store_true", help="docker load it ($DOCKER_HOST), verify the ID")
    args = parser.parse_args(argv)
    if args.cmd == "trim":
        print(trim(args.sdist, args.out))
    elif args.cmd == "wheel":
        got = sha256_file(args.source)
        if got != (args.sha256 or SDIST_SHA256):
            raise SystemExit(
                f"build_llama_cuda: {args.source}: SHA-256 {got}, expected {args.sha256 or SDIST_SHA256}"
            )
        print(build_wheel(args.source, args.arch, args.out, args.jobs))
    else:
        image_id = build_image(args.wheel, args.deps, args.out)
        if args.load:
            load(args.out, image_id)
        print(image_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
