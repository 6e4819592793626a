"""What every tracefix process shares: settings, auth, sockets, metrics, intervals, semantic-convention names,
the states of the state machines."""
