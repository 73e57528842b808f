#!/usr/bin/env python3
"""Draw Mentor Lab's icon (assets/icon.png, 1024x1024) and pack it as a macOS .icns.

The icon: a large disc (the target) and a smaller disc (the draft) overlapping it; the overlap,
where the draft is allowed to lead, is lit. Pure Python (zlib + struct), so it runs anywhere.

  python3 bundle/make_icon.py png  assets/icon.png           # draw the source image
  python3 bundle/make_icon.py icns assets/icon.png OUT.icns  # pack it (ic10 = 1024px PNG)
"""
import math
import struct
import sys
import zlib


def draw(size=1024):
    cx1, cy1, r1 = 0.44 * size, 0.52 * size, 0.33 * size   # target
    cx2, cy2, r2 = 0.68 * size, 0.36 * size, 0.20 * size   # draft
    bg_r = 0.22 * size                                       # rounded-square corner radius
    rows = []
    for y in range(size):
        row = bytearray([0])  # PNG filter: none
        for x in range(size):
            # rounded square mask
            dx = max(bg_r - x, x - (size - 1 - bg_r), 0)
            dy = max(bg_r - y, y - (size - 1 - bg_r), 0)
            if dx * dx + dy * dy > bg_r * bg_r:
                row += bytes((0, 0, 0, 0))
                continue
            t = y / size
            r, g, b = int(24 + 20 * t), int(28 + 24 * t), int(48 + 40 * t)
            in1 = (x - cx1) ** 2 + (y - cy1) ** 2 <= r1 * r1
            in2 = (x - cx2) ** 2 + (y - cy2) ** 2 <= r2 * r2
            if in1 and in2:
                r, g, b = 120, 230, 150   # the mentored region
            elif in1:
                r, g, b = 70, 120, 230    # target
            elif in2:
                r, g, b = 240, 160, 70    # draft
            row += bytes((r, g, b, 255))
        rows.append(bytes(row))
    return png(size, size, b"".join(rows))


def png(w, h, raw):
    def chunk(kind, data):
        c = struct.pack(">I", len(data)) + kind + data
        return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def icns(png_bytes):
    """One-entry ICNS: the 1024x1024 PNG as 'ic10' (macOS scales it for smaller sizes)."""
    if png_bytes[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit("icon source is not a PNG")
    w, h = struct.unpack(">II", png_bytes[16:24])
    kind = {1024: b"ic10", 512: b"ic09", 256: b"ic08", 128: b"ic07"}.get(w)
    if kind is None or w != h:
        raise SystemExit(f"icon must be square 128/256/512/1024 px, got {w}x{h}")
    entry = kind + struct.pack(">I", 8 + len(png_bytes)) + png_bytes
    return b"icns" + struct.pack(">I", 8 + len(entry)) + entry


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "png":
        open(sys.argv[2], "wb").write(draw())
    elif len(sys.argv) == 4 and sys.argv[1] == "icns":
        open(sys.argv[3], "wb").write(icns(open(sys.argv[2], "rb").read()))
    else:
        raise SystemExit(__doc__)
