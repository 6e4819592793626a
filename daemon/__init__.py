"""The tracefix daemon: store, writer, jobs, API and CLI."""
