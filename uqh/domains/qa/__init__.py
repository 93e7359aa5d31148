"""Question answering over a fixed corpus: StrategyQA and HotpotQA, with their shared data loading and retrieval."""
