"""The output formats of resid.analyses.io, by file suffix. Apart from the writers (which import pandas), so that
the command line checks an --out path before it imports anything heavy."""

TABLE = (".csv", ".parquet", ".tex", ".md")  # tables.export
STORE = (".parquet", ".csv")  # ResultStore (the codec resid.analyses.io.frames: CSV and Parquet)
