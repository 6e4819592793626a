"""Training environments, GRPO/SFT recipes and evaluation of capability adapters."""
