"""Other harnesses' results turned into uqh run directories (``uqh import``), written through the store."""
