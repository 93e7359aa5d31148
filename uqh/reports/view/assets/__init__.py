"""Templates, script and stylesheet of `uqh view` (package data)."""
