"""The DuckDB store: schema, migrations, the batched writer, and every query (trajectories, labels and
statistics, runs and adapters, served traffic); the only code that runs SQL."""
