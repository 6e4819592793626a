"""The DuckDB store: schema, migrations, the batched writer, and every query, one module per table
family (traces, labels, environments, runs and adapters, served traffic); the only code that runs SQL."""
