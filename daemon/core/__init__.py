"""What every tracefix process shares: settings, auth, sockets, metrics, intervals, semantic-convention names."""
