"""`uqh view`: a local web server over run directories (run list, run page, trajectory page with token heatmap)."""
