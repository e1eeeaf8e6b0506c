"""Reading report pages (resid.analyses.report) back in tests: their section headings and their tables."""

import html
import re


def headings(page: str) -> list[str]:
    """The h2 headings, unescaped."""
    return [html.unescape(h) for h in re.findall(r"<h2>(.*?)</h2>", page)]


def tables(page: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each table's header cells and its rows' cells, as the page's HTML text (escaped)."""
    found = []
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        header = re.findall(r"<th class=[^>]*>(.*?)</th>", table)
        rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
        found.append((header, rows))
    return found
