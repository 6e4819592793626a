"""The daemon API's routes, one module per group of endpoints; `daemon.app.api` includes each router.

`dependencies` holds what every handler receives besides its own parameters: the daemon, the
authenticated caller, the paging bounds.
"""
