"""`uqh probe`'s write path: per-step probes over recorded runs (P(True), observation surprise)."""
