#!/usr/bin/env python3
"""Renders a terminal capture with ANSI colours (`tmux capture-pane -e -p`) to a PNG, for the README's screenshot.

Usage: ansi2png.py capture.ansi out.png   (needs Pillow and the DejaVu Sans Mono font)
"""
import re
import sys

from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"
SIZE = 15
BG = (24, 24, 28)
FG = (220, 220, 220)
# The 16 standard colours (xterm-like).
PALETTE = [
    (0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16), (36, 114, 200), (188, 63, 188), (17, 168, 205),
    (229, 229, 229), (102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67), (59, 142, 234),
    (214, 112, 214), (41, 184, 219), (255, 255, 255),
]
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def cells(line):
    """Yields (char, fg, bg, bold, reverse) for each character of one captured line."""
    fg, bg, bold, rev = FG, None, False, False
    pos = 0
    for m in SGR.finditer(line):
        for ch in line[pos:m.start()]:
            yield ch, fg, bg, bold, rev
        pos = m.end()
        codes = [int(c) if c else 0 for c in m.group(1).split(";")] or [0]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                fg, bg, bold, rev = FG, None, False, False
            elif c == 1:
                bold = True
            elif c == 7:
                rev = True
            elif c in (22,):
                bold = False
            elif c == 27:
                rev = False
            elif 30 <= c <= 37:
                fg = PALETTE[c - 30]
            elif 90 <= c <= 97:
                fg = PALETTE[c - 90 + 8]
            elif c == 39:
                fg = FG
            elif 40 <= c <= 47:
                bg = PALETTE[c - 40]
            elif 100 <= c <= 107:
                bg = PALETTE[c - 100 + 8]
            elif c == 49:
                bg = None
            elif c in (38, 48) and i + 2 < len(codes) and codes[i + 1] == 5:
                n = codes[i + 2]
                col = PALETTE[n] if n < 16 else FG
                if c == 38:
                    fg = col
                else:
                    bg = col
                i += 2
            i += 1
    for ch in line[pos:]:
        yield ch, fg, bg, bold, rev


def main():
    src, out = sys.argv[1], sys.argv[2]
    lines = open(src, encoding="utf-8", errors="replace").read().rstrip("\n").split("\n")
    font, bold_font = ImageFont.truetype(FONT, SIZE), ImageFont.truetype(BOLD, SIZE)
    w = int(font.getlength("M"))
    h = SIZE + 4
    cols = max(sum(1 for _ in cells(l)) for l in lines)
    img = Image.new("RGB", (cols * w + 16, len(lines) * h + 16), BG)
    d = ImageDraw.Draw(img)
    for y, line in enumerate(lines):
        for x, (ch, fg, bg, bold, rev) in enumerate(cells(line)):
            if rev:
                fg, bg = (bg or BG), fg
            px, py = 8 + x * w, 8 + y * h
            if bg is not None:
                d.rectangle([px, py, px + w, py + h], fill=bg)
            if ch != " ":
                d.text((px, py + 1), ch, font=bold_font if bold else font, fill=fg)
    img.save(out)


if __name__ == "__main__":
    main()
