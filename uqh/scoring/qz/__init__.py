"""q_Z of censored prefixes: estimates from continuation runs and their audit."""
