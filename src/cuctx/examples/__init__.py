"""The seeds' examples written with cuctx; `python -m cuctx demo` runs them all."""

EXAMPLES = ["context_stack", "context_independent", "stream_overlap"]
