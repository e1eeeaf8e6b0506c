"""Reading and writing: tables with provenance sidecars, the crash-safe result store, prompt and corpus files,
and the one atomic write they all use."""
