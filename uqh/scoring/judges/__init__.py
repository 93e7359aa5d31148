"""The GPA judges' scores next to the agent's own confidence: analysis, agreement, typed results."""
