"""The GGUF header reader: metadata of an intact file, a named error for anything else."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from anvil_ctl.adapters.hfcache import GgufError, read_header


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_bytes(*, context: int = 8192, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    """A GGUF header with a string, a uint32, a float and a string array (like a vocabulary)."""
    kvs = [
        _string("general.architecture") + struct.pack("<I", 8) + _string("llama"),
        _string("llama.context_length") + struct.pack("<I", 4) + struct.pack("<I", context),
        _string("llama.rope.freq_base") + struct.pack("<I", 6) + struct.pack("<f", 100000.0),
        _string("tokenizer.ggml.tokens")
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 8, 3)
        + b"".join(_string(t) for t in ("<s>", "a", "b")),
        _string("tokenizer.ggml.scores") + struct.pack("<I", 9) + struct.pack("<IQ", 6, 3) + b"\0" * 12,
    ]
    head = magic + struct.pack("<IQQ", version, 272, len(kvs))
    return head + b"".join(kvs) + b"\0" * 64  # tensor infos and data are not read


class TestReadHeader:
    def test_an_intact_header_reads_back_its_metadata(self, tmp_path: Path) -> None:
        path = tmp_path / "m.gguf"
        path.write_bytes(gguf_bytes())
        header = read_header(path)
        assert (header.version, header.tensor_count) == (3, 272)
        assert header.metadata["general.architecture"] == "llama"
        assert header.metadata["llama.context_length"] == 8192
        assert header.metadata["tokenizer.ggml.tokens"] == "array[3]"
        assert len(header.metadata) == 5

    def test_random_bytes_are_not_gguf(self, tmp_path: Path) -> None:
        path = tmp_path / "garbage.gguf"
        path.write_bytes(b"\x89PNG" + b"\0" * 100)
        with pytest.raises(GgufError, match="not a GGUF file"):
            read_header(path)

    def test_a_file_cut_inside_its_metadata_names_the_offset(self, tmp_path: Path) -> None:
        path = tmp_path / "cut.gguf"
        path.write_bytes(gguf_bytes()[:60])
        with pytest.raises(GgufError, match="cut at byte"):
            read_header(path)

    def test_an_unknown_version_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "v9.gguf"
        path.write_bytes(gguf_bytes(version=9))
        with pytest.raises(GgufError, match="version 9"):
            read_header(path)
