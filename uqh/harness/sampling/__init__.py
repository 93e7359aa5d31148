"""When to draw another sample: consensus stopping of a task's samples and the branch rules of a continuation."""
