"""Reference numbers for tests/test_judge_agreement.py, produced by other people's implementations:

- Krippendorff's alpha by the ``krippendorff`` package (pln-fing-udelar/fast-krippendorff; GPL-3.0, so it is a
  reference only, never imported by uqh), levels nominal / ordinal / interval, value domain 0..3;
- Cohen's kappa (unweighted, linear, quadratic) by scikit-learn's ``cohen_kappa_score`` with labels 0..3.

Cases are random 0-3 rating matrices (units x raters, ~25% missing) and random pairs of 0-3 scores.

    pip install krippendorff==0.9.0 scikit-learn
    python tests/data/make_judge_agreement_reference.py > tests/data/judge_agreement_reference.json
"""
import json
import sys

import krippendorff
import numpy as np
import sklearn
from sklearn.metrics import cohen_kappa_score

rng = np.random.default_rng(20260121)
alpha_cases = []
while len(alpha_cases) < 40:
    units, raters = int(rng.integers(3, 25)), int(rng.integers(2, 6))
    r = rng.integers(0, 4, size=(units, raters)).astype(float)
    if len(alpha_cases) % 2:  # half the cases: raters that mostly agree (alpha well above 0)
        r = np.clip(np.repeat(rng.integers(0, 4, size=(units, 1)), raters, axis=1) + rng.integers(-1, 2, size=r.shape),
                    0, 3).astype(float)
    r[rng.random(r.shape) < 0.25] = np.nan
    try:
        alphas = {lvl: krippendorff.alpha(reliability_data=r.T, level_of_measurement=lvl, value_domain=[0, 1, 2, 3])
                  for lvl in ("nominal", "ordinal", "interval")}
    except (ValueError, ZeroDivisionError):
        continue  # undefined for the reference (e.g. one value only): not a comparison case
    if not all(np.isfinite(v) for v in alphas.values()):
        continue
    alpha_cases.append({"ratings": [[None if np.isnan(x) else int(x) for x in row] for row in r], "alpha": alphas})

kappa_cases = []
for k in range(30):
    n = int(rng.integers(5, 40))
    a = rng.integers(0, 4, size=n)
    b = np.clip(a + rng.integers(-2, 3, size=n), 0, 3) if k % 2 else rng.integers(0, 4, size=n)
    kappa_cases.append({"a": a.tolist(), "b": b.tolist(), "kappa": {
        str(w): cohen_kappa_score(a, b, labels=[0, 1, 2, 3], weights=w) for w in (None, "linear", "quadratic")}})

versions = {"krippendorff": getattr(krippendorff, "__version__", "0.9.0"), "scikit-learn": sklearn.__version__}
lines = ",\n  ".join(json.dumps(c) for c in alpha_cases)
klines = ",\n  ".join(json.dumps(c) for c in kappa_cases)
sys.stdout.write(f'{{"generated_by": {json.dumps(versions)},\n "alpha": [\n  {lines}],\n "kappa": [\n  {klines}]}}\n')
