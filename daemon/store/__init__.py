"""The DuckDB store: schema, migrations, the batched writer; the only code that runs SQL."""
