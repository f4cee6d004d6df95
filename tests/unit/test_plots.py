"""Charts render headless into PNG files (no display, no root)."""

from fabriclab.results import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    return data


def test_bars_lines_and_cdfs_render(tmp_path):
    _png(plots.bars(tmp_path / "b.png", "schemes", ["ecmp", "te"],
                    [("CCT (s)", [1.5, None]), ("max/mean", [2.0, 1.0])]))
    _png(plots.lines(tmp_path / "l.png", "busbw", [1 << 16, 1 << 20], {"busbw": [5.0, 9.5]},
                     "size", "Mbit/s", reference=(10.0, "NIC rate")))
    _png(plots.cdfs(tmp_path / "c.png", "cdf", {"points": [[0.5, 0.2], [1.0, 1.0]],
                                               "values": [3.0, 1.0, 2.0]}, "x"))


def test_charts_differ_with_their_data(tmp_path):
    a = _png(plots.lines(tmp_path / "a.png", "t", [1, 2], {"s": [1.0, 2.0]}, "x", "y", log_x=False))
    b = _png(plots.lines(tmp_path / "b.png", "t", [1, 2], {"s": [2.0, 1.0]}, "x", "y", log_x=False))
    assert a != b
