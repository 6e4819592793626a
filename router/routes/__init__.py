"""The router's HTTP endpoints, one module per group; `router.server.create_app` includes them."""
