"""One episode: the ReAct loop and the parsing of a step's four tags."""
