"""From a training request to an adapter: synthesis and the subprocess jobs (validation, training, gate training)."""
