"""Fixtures: committed files equal what the generator writes; PNGs carry their text."""

from __future__ import annotations

import struct
import zlib

from anvil_stub.rules import png_text
from scripts.fixtures import FIXTURES_DIR, IMAGE_TEXTS, generated_files, render_png


class TestFixtures:
    def test_committed_fixtures_equal_the_generated_ones(self) -> None:
        for name, data in generated_files().items():
            assert (FIXTURES_DIR / name).read_bytes() == data, name

    def test_each_png_carries_its_known_text_in_an_anvil_text_chunk(self) -> None:
        for name, text in IMAGE_TEXTS.items():
            assert png_text((FIXTURES_DIR / name).read_bytes()) == text

    def test_the_png_is_well_formed(self) -> None:
        png = render_png("AB 12")
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        pos, kinds = 8, []
        while pos < len(png):
            (length,) = struct.unpack(">I", png[pos : pos + 4])
            kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
            (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
            assert zlib.crc32(kind + data) == crc
            kinds.append(kind)
            pos += 12 + length
        assert kinds == [b"IHDR", b"tEXt", b"IDAT", b"IEND"]
        width, height = struct.unpack(">II", png[16:24])
        raw = zlib.decompress(png[png.index(b"IDAT") + 4 :].split(b"IEND")[0][:-8])
        assert len(raw) == height * (width + 1)
        assert b"\x00" * 4 in raw  # some ink was drawn
