"""An X/Y/Z plot's grid image, A1111-like: the cells' images side by side (X across, Y down), each column headed by
its X value and each row led by its Y value, black on white, one grid per Z value titled with it.

    grid = draw_grid(images, columns=2, rows=2, x_labels=["Steps: 4", "Steps: 6"], y_labels=["CFG Scale: 3", ...])

A cell that did not finish (a stopped plot) is left white, as A1111 leaves a failed cell empty. PIL only.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

#: The labels' size: A1111's (cell width + height) / 25, but never below what a 64-pixel cell's label can be read at.
SMALLEST_FONT = 12
BACKGROUND = "white"
INK = (0, 0, 0)


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _wrapped(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> list[str]:
    """`text` in lines no wider than `width` pixels, broken at spaces (a word wider than that keeps its line)."""
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines or [""]


def _block(draw: ImageDraw.ImageDraw, lines: list[str], font) -> tuple[int, int]:
    """(width, height) of `lines` drawn one under another."""
    boxes = [draw.textbbox((0, 0), line or " ", font=font) for line in lines]
    return max(box[2] - box[0] for box in boxes), sum(box[3] - box[1] for box in boxes) + 4 * (len(lines) - 1)


def _write(draw: ImageDraw.ImageDraw, lines: list[str], font, centre: tuple[float, float]) -> None:
    """`lines` centred on `centre`."""
    _, height = _block(draw, lines, font)
    y = centre[1] - height / 2
    for line in lines:
        box = draw.textbbox((0, 0), line or " ", font=font)
        draw.text((centre[0] - (box[2] - box[0]) / 2 - box[0], y - box[1]), line, fill=INK, font=font)
        y += box[3] - box[1] + 4


def draw_grid(
    images: Sequence[Image.Image | None],
    columns: int,
    rows: int,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    title: str = "",
) -> Image.Image:
    """The cells' `images` (row by row, X fastest; None: a cell that did not finish) as one labelled RGB image.
    Labels that are all empty take no margin (a plot without a Y axis has no left column)."""
    cell_w, cell_h = next((image.size for image in images if image is not None), (64, 64))
    font = _font(max(SMALLEST_FONT, (cell_w + cell_h) // 25))
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    spacing = font.size // 2
    left = 0
    if any(y_labels):
        left = max(cell_w * 3 // 4, max(_block(measure, [label], font)[0] for label in y_labels) + 2 * spacing)
        left = min(left, 2 * cell_w)
    heads = [_wrapped(measure, label, font, cell_w - spacing) for label in x_labels] if any(x_labels) else []
    top = max(_block(measure, lines, font)[1] for lines in heads) + 2 * spacing if heads else 0
    titled = [_wrapped(measure, title, font, left + columns * cell_w - spacing)] if title else []
    above = _block(measure, titled[0], font)[1] + 2 * spacing if titled else 0
    grid = Image.new("RGB", (left + columns * cell_w, above + top + rows * cell_h), BACKGROUND)
    draw = ImageDraw.Draw(grid)
    if titled:
        _write(draw, titled[0], font, (grid.width / 2, above / 2))
    for index, image in enumerate(images):
        if image is not None:
            grid.paste(image.convert("RGB"), (left + index % columns * cell_w, above + top + index // columns * cell_h))
    for column, lines in enumerate(heads):
        _write(draw, lines, font, (left + (column + 0.5) * cell_w, above + top / 2))
    for row, label in enumerate(y_labels if any(y_labels) else []):
        lines = _wrapped(measure, label, font, left - spacing)
        _write(draw, lines, font, (left / 2, above + top + (row + 0.5) * cell_h))
    return grid
