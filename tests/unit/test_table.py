"""The terminal table every command prints: widths, alignment, None and float cells, title."""

import pytest

from fabriclab.table import format_table


def test_numbers_right_text_left_with_title():
    text = format_table(("name", "count", "ratio"),
                        [("a", 1, 0.5), ("long-name", 12345, 1234.7)], title="Uplinks")
    assert text.split("\n") == [
        "Uplinks",
        "name       count  ratio",
        "---------  -----  -----",
        "a              1  0.500",
        "long-name  12345   1235",
    ]


def test_no_title_starts_with_the_header():
    text = format_table(("a", "b"), [("x", 1)])
    assert text.split("\n")[0] == "a  b"
    assert format_table(("a", "b"), [("x", 1)], title="") == text


def test_none_is_a_dash_and_keeps_a_number_column_right_aligned():
    text = format_table(("link", "drops"), [("l1-s1", None), ("l1-s2", 1234)])
    assert text.split("\n")[2:] == [
        "l1-s1      -",
        "l1-s2   1234",
    ]


def test_a_column_with_any_text_is_left_aligned():
    text = format_table(("value",), [(1,), ("n/a",), (22,)])
    assert text.split("\n")[2:] == ["1", "n/a", "22"]


@pytest.mark.parametrize("value, cell", [
    (0.5, "0.500"),
    (0.12345, "0.123"),
    (-2.0, "-2.000"),
    (999.9994, "999.999"),
    (1000.0, "1000"),
    (12345.6, "12346"),
    (-1500.2, "-1500"),
    (7, "7"),                 # ints are not floats
    (0.0, "0.000"),
])
def test_cell_formatting(value, cell):
    assert format_table(("v",), [(value,)]).split("\n")[2].strip() == cell


def test_columns_fit_the_widest_cell_or_header():
    text = format_table(("a", "longer header"), [("wide cell here", 1)])
    header, rule, row = text.split("\n")
    assert rule == "-" * 14 + "  " + "-" * 13
    assert header.index("longer") == row.index("1") - len("longer header") + 1 == 16


def test_no_trailing_spaces():
    text = format_table(("num", "text"), [(1, "a"), (22, "bbbbbb")], title="t")
    assert all(line == line.rstrip() for line in text.split("\n"))


def test_no_rows_gives_header_and_rule():
    assert format_table(("spec", "hosts"), []) == "spec  hosts\n----  -----"

