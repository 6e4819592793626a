"""Runs and adapters, their promotion lifecycle, canaries, served-traffic statistics, the router admin client."""
