"""Tables as text: markdown from rows of text (``markdown_rows``: the report's tables, numbers right-aligned) or
from a DataFrame (``markdown``: the speed, sweep and run tables)."""
from __future__ import annotations

import pandas as pd


def markdown_rows(header: list[str], body: list[list[str]], lead: int = 2) -> str:
    """A GitHub markdown table of text rows; the first ``lead`` columns left-aligned, the rest (numbers) right."""
    rows = [header, ["---"] * lead + ["---:"] * (len(header) - lead)] + body
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (pandas' own needs the tabulate package)."""
    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    rows = [list(map(str, df.columns)), ["---"] * len(df.columns)]
    rows += [[cell(v) for v in r] for r in df.itertuples(index=False)]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)
