"""``uqh report``: the HTML page, its figures and trace explorer."""
