"""OTLP receivers, attribute dialects, trajectory assembly and file import."""
