"""GPA LLM judges over recorded traces: the runner, and the prompts' rendering and reply parsing."""
