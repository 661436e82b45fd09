#!/usr/bin/env python3
"""Build the llama.cpp engine image deterministically, in `docker save` format.

The image holds one layer: the mount points of the stub image (`/usr`, `/lib`, `/lib64`
are bind-mounted read-only from the host at run time, so the container's Python is the
host's Debian `/usr/bin/python3`, 3.11) plus `/opt/llama/site-packages`, the
llama-cpp-python wheel and the pinned wheels of its `[server]` dependencies unpacked
as an installer would (purelib/platlib at the root, dist-info kept, no scripts, no
byte code), and `/opt/llama/MANIFEST.json` naming every wheel by SHA-256. llama-cpp-python
loads `llama_cpp/lib/libllama.so` through ctypes, so the compiled part is bound to the
host's glibc/libstdc++/libgomp, not to a Python ABI. The model is never in the image: it
is bind-mounted read-only from the model cache at run time (`/model`).

Like the stub image there is no Cmd, Entrypoint or Env: the recipe gives them
(`/usr/bin/python3 -m llama_cpp.server ...`, `PYTHONPATH=/opt/llama/site-packages`).
Every byte is fixed (member order, timestamps, owners, modes, JSON layout), so the image
ID -- the SHA-256 of the config JSON -- depends only on the wheels' bytes: the same
wheel cache gives the same ID on every run and every machine. The compiled wheel itself
is not bit-reproducible, so a rebuilt wheel gives a new ID (see build_llama_wheel.py).

    build_llama_image.py --print-id         # the ID (builds the tarball if not cached; no Docker)
    build_llama_image.py --out llama.tar    # the tarball, for `docker load`
    build_llama_image.py --load             # load into $DOCKER_HOST, verify the ID, print it

Inputs: the wheel cache (--wheels, else $ANVIL_WHEEL_CACHE, else ~/.cache/anvil/wheels)
filled by build_llama_wheel.py. The tarball is cached in $ANVIL_IMAGE_CACHE (default
~/.cache/anvil/images) under a key over this script and every input wheel's SHA-256.
Standard library only, except `--load` (the docker SDK if importable, else the CLI).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_llama_wheel import VERSION, WHEEL_GLOB, read_lock, sha256_file

TAG_REPO, TAG_NAME = "anvil-llama", "local"
TAG = f"{TAG_REPO}:{TAG_NAME}"
EPOCH = 1704067200  # 2024-01-01T00:00:00Z, the fixed mtime of every member
CREATED = "2024-01-01T00:00:00Z"
FORMAT = "1"
SITE = "opt/llama/site-packages"
CONTAINER_SITE = "/" + SITE
CONTAINER_PYTHON = "/usr/bin/python3"
MODEL_MOUNT = "/model"
# Top-level directories of the llama-cpp-python wheel that no import reaches: C headers,
# CMake/pkg-config files and a second copy of the shared libraries (llama_cpp loads
# llama_cpp/lib/*.so). Left out to keep the layer small; listed in MANIFEST.json.
LLAMA_SKIPPED_TOPS = ("include/", "lib/", "bin/")

# (path, kind, mode, payload): the skeleton of the stub image plus /opt/llama and /model
_ROOTFS: tuple[tuple[str, str, int, str], ...] = (
    ("bin", "symlink", 0o777, "usr/bin"),
    ("dev", "dir", 0o755, ""),
    ("etc", "dir", 0o755, ""),
    ("etc/group", "file", 0o644, "root:x:0:\nnogroup:x:65534:\n"),
    (
        "etc/passwd",
        "file",
        0o644,
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
    ),
    ("lib", "dir", 0o755, ""),
    ("lib64", "dir", 0o755, ""),
    ("model", "dir", 0o755, ""),
    ("opt", "dir", 0o755, ""),
    ("opt/llama", "dir", 0o755, ""),
    ("proc", "dir", 0o755, ""),
    ("root", "dir", 0o700, ""),
    ("sbin", "dir", 0o755, ""),  # a real directory: Docker mounts docker-init here (init=True)
    ("sys", "dir", 0o755, ""),
    ("tmp", "dir", 0o1777, ""),
    ("usr", "dir", 0o755, ""),
    ("var", "dir", 0o755, ""),
    ("var/tmp", "dir", 0o1777, ""),
)


def log(msg: str) -> None:
    print(f"build_llama_image: {msg}", file=sys.stderr)


def default_wheel_cache() -> Path:
    env = os.environ.get("ANVIL_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "anvil" / "wheels"


def default_image_cache() -> Path:
    env = os.environ.get("ANVIL_IMAGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "anvil" / "images"


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name


def input_wheels(cache: Path) -> list[Wheel]:
    """The llama-cpp-python wheel and every pinned dependency wheel, verified, sorted by name."""
    llama = sorted(cache.glob(WHEEL_GLOB))
    if len(llama) != 1:
        raise SystemExit(
            f"build_llama_image: expected exactly one {WHEEL_GLOB} in {cache}, found "
            f"{[p.name for p in llama]}; run scripts/build_llama_wheel.py"
        )
    wheels = [Wheel(llama[0], sha256_file(llama[0]))]
    for digest, name in read_lock():
        path = cache / name
        if not path.is_file():
            raise SystemExit(f"build_llama_image: {path} missing; run scripts/build_llama_wheel.py")
        got = sha256_file(path)
        if got != digest:
            raise SystemExit(f"build_llama_image: {path}: SHA-256 {got}, pinned {digest}")
        wheels.append(Wheel(path, digest))
    return sorted(wheels, key=lambda w: w.name)


def cache_key(wheels: list[Wheel]) -> str:
    """Over the builder's own bytes and the inputs: a changed script or wheel misses the cache."""
    return hashlib.sha256(
        _canonical(
            {
                "format": FORMAT,
                "builder": sha256_file(Path(__file__).resolve()),
                "wheels": [[w.name, w.sha256] for w in wheels],
            }
        )
    ).hexdigest()


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _info(name: str, kind: str, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode = mode
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.size = size
    info.linkname = linkname
    return info


@dataclass(frozen=True)
class _Member:
    kind: str  # dir, file, symlink
    mode: int
    data: bytes | None = None  # file payload, or None when read from a wheel
    wheel: Path | None = None
    member: str = ""
    host_file: Path | None = None  # a file copied as it is (extra_files)
    size: int = 0
    linkname: str = ""


def _site_path(wheel: Wheel, name: str, is_llama: bool) -> str | None:
    """Where a wheel member goes under SITE, or None when it is not installed."""
    top, _, rest = name.partition("/")
    if top.endswith(".data"):
        scheme, _, rel = rest.partition("/")
        return rel if scheme in ("purelib", "platlib") and rel else None
    if is_llama and name.startswith(LLAMA_SKIPPED_TOPS):
        return None
    return name


def layer_members(
    wheels: list[Wheel],
    *,
    extra_files: dict[str, Path] | None = None,
    python: str = f"{CONTAINER_PYTHON} (host, bind-mounted read-only; CPython 3.11)",
    variant: str = "cpu",
) -> tuple[dict[str, _Member], dict[str, object]]:
    """Every member of the layer by path, and the manifest describing where they came from.

    `extra_files`: files beside the wheels' (site-packages path -> host file), each named in
    the manifest by SHA-256 (the CUDA engine's runtime libraries); `python` and `variant`
    describe the interpreter the wheels are for and the build."""
    members: dict[str, _Member] = {}
    for path, kind, mode, payload in _ROOTFS:
        if kind == "file":
            members[path] = _Member(kind, mode, data=payload.encode(), size=len(payload.encode()))
        else:
            members[path] = _Member(kind, mode, linkname=payload)
    skipped: dict[str, int] = {}
    for wheel in wheels:
        is_llama = wheel.name.startswith("llama_cpp_python-")
        with zipfile.ZipFile(wheel.path) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                rel = _site_path(wheel, info.filename, is_llama)
                if rel is None:
                    skipped[wheel.name] = skipped.get(wheel.name, 0) + 1
                    continue
                target = f"{SITE}/{rel}"
                if target in members:
                    raise SystemExit(f"build_llama_image: {target} in two wheels (second: {wheel.name})")
                executable = (info.external_attr >> 16) & 0o111
                members[target] = _Member(
                    "file",
                    0o755 if executable else 0o644,
                    wheel=wheel.path,
                    member=info.filename,
                    size=info.file_size,
                )
    extras = []
    for rel, source in sorted((extra_files or {}).items()):
        target = f"{SITE}/{rel}"
        if target in members:
            raise SystemExit(f"build_llama_image: {target} is in a wheel and an extra file")
        members[target] = _Member("file", 0o644, host_file=source, size=source.stat().st_size)
        extras.append({"path": target, "sha256": sha256_file(source), "bytes": source.stat().st_size})
    manifest: dict[str, object] = {
        "format": FORMAT,
        "engine": "llama-cpp-python",
        "version": VERSION,
        "python": python,
        "site_packages": CONTAINER_SITE,
        "wheels": [{"file": w.name, "sha256": w.sha256} for w in wheels],
        **({"variant": variant, "extra_files": extras} if variant != "cpu" else {}),
        "not_installed": {
            "llama-cpp-python": list(LLAMA_SKIPPED_TOPS),
            "all": [".data/scripts", ".data/headers", ".data/data"],
            "members_skipped": skipped,
        },
    }
    data = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    members["opt/llama/MANIFEST.json"] = _Member("file", 0o644, data=data, size=len(data))
    for path in list(members):  # every parent directory, as a member of its own
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            if parent not in members:
                members[parent] = _Member("dir", 0o755)
            elif members[parent].kind != "dir":
                raise SystemExit(f"build_llama_image: {parent} is a file and a directory")
    return members, manifest


def write_layer(members: dict[str, _Member], out: Path) -> str:
    """Write the layer tar (members sorted by path, so parents first); return its SHA-256."""
    zips: dict[Path, zipfile.ZipFile] = {}
    try:
        with out.open("wb") as fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(members):
                m = members[path]
                if m.kind == "dir":
                    tar.addfile(_info(path + "/", "dir", m.mode))
                elif m.kind == "symlink":
                    tar.addfile(_info(path, "symlink", m.mode, linkname=m.linkname))
                elif m.data is not None:
                    tar.addfile(_info(path, "file", m.mode, size=m.size), io.BytesIO(m.data))
                elif m.host_file is not None:
                    with m.host_file.open("rb") as src:
                        tar.addfile(_info(path, "file", m.mode, size=m.size), src)
                else:
                    assert m.wheel is not None
                    zf = zips.get(m.wheel) or zips.setdefault(m.wheel, zipfile.ZipFile(m.wheel))
                    with zf.open(m.member) as src:
                        tar.addfile(_info(path, "file", m.mode, size=m.size), src)
    finally:
        for zf in zips.values():
            zf.close()
    return sha256_file(out)


def image_config(diff_id: str, manifest_sha256: str, llama_sha256: str) -> bytes:
    """The image config JSON; its SHA-256 is the image ID. No Cmd, Entrypoint or Env."""
    return _canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": CREATED,
            "config": {
                "Labels": {
                    "io.anvil.image": "llama-cpp-python",
                    "io.anvil.image-format": FORMAT,
                    "io.anvil.llama-cpp-python": VERSION,
                    "io.anvil.llama-wheel-sha256": llama_sha256,
                    "io.anvil.wheels-manifest-sha256": manifest_sha256,
                },
                "WorkingDir": "/",
            },
            "history": [{"created": CREATED, "created_by": "anvil_ctl scripts/build_llama_image.py"}],
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    )


def build_tarball(wheels: list[Wheel], out: Path, **layer: object) -> str:
    """Write the `docker save`-format tarball to `out`; return the image ID (`layer`: the
    keyword arguments of layer_members)."""
    members, _ = layer_members(wheels, **layer)  # type: ignore[arg-type]
    manifest_member = members["opt/llama/MANIFEST.json"]
    assert manifest_member.data is not None
    manifest_sha = hashlib.sha256(manifest_member.data).hexdigest()
    llama_sha = next(w.sha256 for w in wheels if w.name.startswith("llama_cpp_python-"))
    with tempfile.TemporaryDirectory(prefix="anvil-llama-image-", dir=out.parent) as tmp:
        layer = Path(tmp) / "layer.tar"
        layer_hex = write_layer(members, layer)
        diff_id = "sha256:" + layer_hex
        config = image_config(diff_id, manifest_sha, llama_sha)
        image_hex = hashlib.sha256(config).hexdigest()
        layer_dir = hashlib.sha256(diff_id.encode()).hexdigest()  # the v1 layer ID, any fixed hex
        manifest_json = [
            {"Config": f"{image_hex}.json", "RepoTags": [TAG], "Layers": [f"{layer_dir}/layer.tar"]}
        ]
        partial = out.with_name(out.name + ".partial")
        with partial.open("wb") as fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
            small = [
                (f"{image_hex}.json", config),
                (f"{layer_dir}/", None),
                (f"{layer_dir}/VERSION", b"1.0"),
                (f"{layer_dir}/json", _canonical({"id": layer_dir, "created": CREATED, "os": "linux"})),
            ]
            for name, data in small:
                if data is None:
                    tar.addfile(_info(name, "dir", 0o755))
                else:
                    tar.addfile(_info(name, "file", 0o644, size=len(data)), io.BytesIO(data))
            with layer.open("rb") as src:
                tar.addfile(_info(f"{layer_dir}/layer.tar", "file", 0o644, size=layer.stat().st_size), src)
            for name, data in (
                ("manifest.json", _canonical(manifest_json)),
                ("repositories", _canonical({TAG_REPO: {TAG_NAME: layer_dir}})),
            ):
                tar.addfile(_info(name, "file", 0o644, size=len(data)), io.BytesIO(data))
        os.replace(partial, out)
    return "sha256:" + image_hex


def tarball(wheel_cache: Path, image_cache: Path, *, use_cache: bool = True) -> tuple[str, Path]:
    """(image ID, path of the tarball): from the image cache when its key matches, else built."""
    wheels = input_wheels(wheel_cache)
    key = cache_key(wheels)
    image_cache.mkdir(parents=True, exist_ok=True)
    path = image_cache / f"anvil-llama-{key[:16]}.tar"
    id_file = path.with_suffix(".id")
    if use_cache and path.is_file() and id_file.is_file():
        return id_file.read_text().strip(), path
    t0 = time.monotonic()
    image_id = build_tarball(wheels, path)
    id_file.write_text(image_id + "\n")
    for stale in [*image_cache.glob("anvil-llama-*.tar"), *image_cache.glob("anvil-llama-*.id")]:
        if stale not in (path, id_file):  # tarballs of other inputs or builder versions
            stale.unlink(missing_ok=True)
    log(f"built {path.name} ({path.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - t0:.1f}s")
    return image_id, path


def load(path: Path, expected_id: str, docker_host: str | None = None) -> str:
    """Load the tarball into the engine at docker_host (default $DOCKER_HOST); verify the ID."""
    env = dict(os.environ)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    try:
        import docker

        client = docker.DockerClient(
            base_url=env.get("DOCKER_HOST", "unix:///var/run/docker.sock"), timeout=600
        )
        try:
            with path.open("rb") as fh:
                images = client.images.load(fh)
            loaded = images[0].id if images else ""
        finally:
            client.close()
    except ImportError:
        subprocess.run(["docker", "load", "-i", str(path)], check=True, capture_output=True, env=env)
        out = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", TAG],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        loaded = out.stdout.strip()
    if loaded != expected_id:
        log(f"loaded image ID {loaded!r} differs from computed {expected_id}")
        raise SystemExit(1)
    return loaded


def load_image(docker_host: str | None = None, *, wheel_cache: Path | None = None) -> str:
    """Build (or reuse) the tarball and load it into docker_host; return the verified image ID."""
    image_id, path = tarball(wheel_cache or default_wheel_cache(), default_image_cache())
    return load(path, image_id, docker_host)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wheels", type=Path, default=None, help="wheel cache directory")
    parser.add_argument("--print-id", action="store_true", help="print the image ID (no Docker)")
    parser.add_argument("--out", type=Path, help="copy the docker-save tarball here")
    parser.add_argument("--load", action="store_true", help="docker load it ($DOCKER_HOST), verify the ID")
    parser.add_argument("--no-cache", action="store_true", help="rebuild even when the tarball is cached")
    args = parser.parse_args(argv)
    if not (args.print_id or args.out or args.load):
        parser.error("give at least one of --print-id, --out, --load")
    image_id, path = tarball(
        args.wheels or default_wheel_cache(), default_image_cache(), use_cache=not args.no_cache
    )
    if args.out:
        with path.open("rb") as src, args.out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    if args.load:
        t0 = time.monotonic()
        load(path, image_id)
        log(f"loaded {image_id} in {time.monotonic() - t0:.1f}s")
    print(image_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
