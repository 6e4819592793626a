"""OpenAI-compatible serving of the base model and the live capability adapters."""
