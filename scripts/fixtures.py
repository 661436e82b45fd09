"""Writes the qualification's committed fixtures: OCR images (stdlib PNG, 5x7 bitmap font),
their cases, and the coding answer book the stub engine answers from.

Each PNG draws its known text and also carries it in a `tEXt` chunk with keyword
`anvil-text`, which the stub engine reads (docs/CONTRACTS.md, answer rule 6).
`python -m scripts.fixtures [DIR]` rewrites the files in `anvil_ctl/fixtures`; a unit test
proves the committed files equal what this module generates.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

from anvil_ctl.qualify.gates.coding import TASKS

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "anvil_ctl" / "fixtures"
TEXT_KEYWORD = b"anvil-text"

_FONT: dict[str, tuple[str, ...]] = {
    "A": ("01110", "10001", "10001", "11111", "10001", "10001", "10001"),
    "B": ("11110", "10001", "10001", "11110", "10001", "10001", "11110"),
    "C": ("01110", "10001", "10000", "10000", "10000", "10001", "01110"),
    "D": ("11110", "10001", "10001", "10001", "10001", "10001", "11110"),
    "E": ("11111", "10000", "10000", "11110", "10000", "10000", "11111"),
    "F": ("11111", "10000", "10000", "11110", "10000", "10000", "10000"),
    "G": ("01110", "10001", "10000", "10111", "10001", "10001", "01111"),
    "H": ("10001", "10001", "10001", "11111", "10001", "10001", "10001"),
    "I": ("01110", "00100", "00100", "00100", "00100", "00100", "01110"),
    "J": ("00111", "00010", "00010", "00010", "00010", "10010", "01100"),
    "K": ("10001", "10010", "10100", "11000", "10100", "10010", "10001"),
    "L": ("10000", "10000", "10000", "10000", "10000", "10000", "11111"),
    "M": ("10001", "11011", "10101", "10101", "10001", "10001", "10001"),
    "N": ("10001", "10001", "11001", "10101", "10011", "10001", "10001"),
    "O": ("01110", "10001", "10001", "10001", "10001", "10001", "01110"),
    "P": ("11110", "10001", "10001", "11110", "10000", "10000", "10000"),
    "Q": ("01110", "10001", "10001", "10001", "10101", "10010", "01101"),
    "R": ("11110", "10001", "10001", "11110", "10100", "10010", "10001"),
    "S": ("01111", "10000", "10000", "01110", "00001", "00001", "11110"),
    "T": ("11111", "00100", "00100", "00100", "00100", "00100", "00100"),
    "U": ("10001", "10001", "10001", "10001", "10001", "10001", "01110"),
    "V": ("10001", "10001", "10001", "10001", "10001", "01010", "00100"),
    "W": ("10001", "10001", "10001", "10101", "10101", "10101", "01010"),
    "X": ("10001", "10001", "01010", "00100", "01010", "10001", "10001"),
    "Y": ("10001", "10001", "01010", "00100", "00100", "00100", "00100"),
    "Z": ("11111", "00001", "00010", "00100", "01000", "10000", "11111"),
    "0": ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    "1": ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    "2": ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    "3": ("11111", "00010", "00100", "00010", "00001", "10001", "01110"),
    "4": ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    "5": ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    "6": ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    "7": ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    "8": ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    "9": ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
    " ": ("00000",) * 7,
    "-": ("00000", "00000", "00000", "11111", "00000", "00000", "00000"),
}


OCR_CASES = [
    {"id": "single-anvil", "images": ["ocr-anvil-42.png"], "expected": "ANVIL 42"},
    {"id": "single-heron", "images": ["ocr-blue-heron.png"], "expected": "BLUE HERON"},
    {"id": "single-port", "images": ["ocr-port-8001.png"], "expected": "PORT 8001"},
    {"id": "single-reserve", "images": ["ocr-reserve-3072.png"], "expected": "RESERVE 3072 MIB"},
    {"id": "single-model", "images": ["ocr-model-ok.png"], "expected": "MODEL OK"},
    {
        "id": "two-image-compare",
        "images": ["ocr-left-17.png", "ocr-right-29.png"],
        "expected": "LEFT 17 RIGHT 29",
    },
]
IMAGE_TEXTS = {
    "ocr-anvil-42.png": "ANVIL 42",
    "ocr-blue-heron.png": "BLUE HERON",
    "ocr-port-8001.png": "PORT 8001",
    "ocr-reserve-3072.png": "RESERVE 3072 MIB",
    "ocr-model-ok.png": "MODEL OK",
    "ocr-left-17.png": "LEFT 17",
    "ocr-right-29.png": "RIGHT 29",
}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def render_png(text: str, *, scale: int = 4, margin: int = 3) -> bytes:
    """A grayscale PNG of `text` (upper case, digits, space, dash) with an `anvil-text` chunk."""
    glyphs = [_FONT[ch] for ch in text.upper()]
    cols = max(1, len(glyphs) * 6 - 1)
    width = (cols + 2 * margin) * scale
    height = (7 + 2 * margin) * scale
    rows = []
    for y in range(height):
        gy = y // scale - margin
        row = bytearray(b"\xff" * width)
        if 0 <= gy < 7:
            for gi, glyph in enumerate(glyphs):
                for gx, bit in enumerate(glyph[gy]):
                    if bit == "1":
                        x0 = (margin + gi * 6 + gx) * scale
                        row[x0 : x0 + scale] = b"\x00" * scale
        rows.append(b"\x00" + bytes(row))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"tEXt", TEXT_KEYWORD + b"\x00" + text.encode("latin-1"))
        + _chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + _chunk(b"IEND", b"")
    )


def generated_files() -> dict[str, bytes]:
    """Every fixture file by name, as this module generates it."""
    files = {name: render_png(text) for name, text in IMAGE_TEXTS.items()}
    files["ocr_cases.json"] = (json.dumps(OCR_CASES, indent=2) + "\n").encode()
    # The stub's `--answer-book`: each coding task's marker -> its reference answer.
    book = [{"match": task.marker, "answer": task.reference} for task in TASKS]
    files["coding_answer_book.json"] = (json.dumps(book, indent=2) + "\n").encode()
    return files


def write_fixtures(out_dir: Path = FIXTURES_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in sorted(generated_files().items()):
        path = out_dir / name
        path.write_bytes(data)
        written.append(path)
    return written


if __name__ == "__main__":
    write_fixtures(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES_DIR)
