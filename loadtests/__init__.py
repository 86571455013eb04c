"""Load tests and benchmarks; they talk to the service over HTTP only."""
