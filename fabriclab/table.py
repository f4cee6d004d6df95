"""Plain-text tables for the terminal: the one formatter every command prints with."""

import re

_NUMBER = re.compile(r"^-?[0-9][0-9,]*(\.[0-9]+)?( ?%)?$")


def _cell(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(header, rows, title=None):
    """Columns sized to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    # A column is right-aligned when every cell is a number, or a string that reads as one
    # (callers pre-format some numbers, e.g. one decimal for percentages).
    numeric = [bool(rows) and all(row[i] is None or isinstance(row[i], (int, float))
                                  or (isinstance(row[i], str) and _NUMBER.match(row[i]))
                                  for row in rows)
               for i in range(len(header))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [title] if title else []
    out.append(line(header))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def markdown_table(header, rows):
    """A markdown table (a list of lines, a blank one last); None shows as `-`."""
    def cell(value):
        return "-" if value is None else str(value).replace("|", "\\|")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def fixed(value, decimals=2):
    """A number as text with `decimals` places; None stays None (a table shows it as `-`)."""
    return None if value is None else f"{value:.{decimals}f}"


def progress_bar(fraction, label="traffic", stream=None):
    """Redraw a one-line progress bar (callers print a newline when done)."""
    import sys

    stream = stream or sys.stdout
    width = 30
    done = int(max(0.0, min(1.0, fraction)) * width)
    stream.write(f"\r  {label:<18} [{'#' * done}{'.' * (width - done)}] {100 * fraction:3.0f}%")
    stream.flush()
