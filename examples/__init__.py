"""Example agents and traffic generators for tracefix."""
