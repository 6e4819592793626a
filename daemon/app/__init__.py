"""The daemon process and its clients: service, API, CLI, API client, supervisor, demo."""
