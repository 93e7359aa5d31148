"""The reliability certificate of ``uqh certify``: conformal bounds over self-consistency answers."""
