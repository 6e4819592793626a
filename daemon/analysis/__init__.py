"""Capability analysis: the capability model and plugins, rule, LLM and evaluation labelers, the analyzer, the trigger."""
