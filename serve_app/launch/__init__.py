"""What `make serve` runs before `serve run`: the port pre-flight and the dashboard banner."""
