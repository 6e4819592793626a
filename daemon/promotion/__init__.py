"""The promotion lifecycle of adapters, canaries and the live watch, served-traffic statistics, the router admin client."""
