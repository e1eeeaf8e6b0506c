"""Reading and writing: tables with provenance sidecars, the crash-safe result store, prompt and corpus files,
and what they share: one atomic write (`atomic`), one exact CSV / Parquet codec (`frames`), one reader of text
files (`texts`: the `.txt` rule and the JSONL line reader)."""
