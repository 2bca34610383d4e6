"""The probe images Gate 3 sends: drawn here, so the right answer is known.

Standard library only (zlib + struct), so the step image needs no imaging
library. :func:`solid_png` is a real PNG of one colour (the answer is its
name); :func:`broken_png` is a PNG cut off mid-data, which a server must
refuse with a 4xx (the client's mistake), not answer with a 5xx (its own).
"""

from __future__ import annotations

import base64
import struct
import zlib

__all__ = ["COLOURS", "solid_png", "broken_png", "data_url"]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 20, 20),
    "green": (20, 180, 40),
    "blue": (20, 40, 220),
}


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def solid_png(colour: str = "red", size: int = 64) -> bytes:
    """An 8-bit RGB PNG of ``size`` x ``size`` pixels, all one named colour."""
    r, g, b = COLOURS[colour]
    row = b"\x00" + bytes((r, g, b)) * size  # filter type 0 (None) per scanline
    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit, colour type 2 (RGB)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", zlib.compress(row * size, 9)) + _chunk(b"IEND", b""))


def broken_png() -> bytes:
    """A PNG signature and header followed by half an IDAT chunk: undecodable."""
    good = solid_png("blue")
    return good[: len(good) // 2]


def data_url(png: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(png).decode()}"
