"""scikit-learn models as skl2onnx writes them, in a warm loop against onnxruntime.

    python benchmarks/sklearn_models.py [--batch 1] [--rounds 3] [--baseline PATH] [--keep DIR]

Builds seven estimators on a fixed synthetic problem (`make_classification` /
`make_regression`, 20 features, seeded): a 100-tree random forest, 100-stage gradient
boosting, one decision tree, an RBF SVC with probabilities, a scaled logistic regression,
5-nearest neighbours and Gaussian naive Bayes; converts each with skl2onnx (no ZipMap), writes
it with a batch of `--batch` rows beside it (MODEL.onnx.feeds.npz), and measures them with
`warm_loop.py`: each runtime in a fresh process per round, alternating, after warm-up (the
compiled loops of tree ensembles and SVM coupling run once Numba has loaded, as in a
long-running service). Needs scikit-learn and skl2onnx (the test dependencies).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warm_loop  # noqa: E402


def estimators():
    from sklearn.datasets import make_classification, make_regression
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC
    from sklearn.tree import DecisionTreeClassifier

    x, y = make_classification(n_samples=500, n_features=20, n_informative=10, n_classes=3, random_state=0)
    xr, yr = make_regression(n_samples=500, n_features=20, random_state=0)
    x, xr = x.astype(np.float32), xr.astype(np.float32)
    return {
        "random-forest-100": (RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0).fit(x, y), x),
        "gradient-boosting-100": (GradientBoostingRegressor(n_estimators=100, max_depth=3, random_state=0).fit(xr, yr), xr),
        "decision-tree": (DecisionTreeClassifier(max_depth=10, random_state=0).fit(x, y), x),
        "svc-rbf-proba": (SVC(probability=True, random_state=0).fit(x, y), x),
        "scaled-logistic": (make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y), x),
        "knn-5": (KNeighborsClassifier(5).fit(x, y), x),
        "gaussian-nb": (GaussianNB().fit(x, y), x),
    }


def write_models(folder: Path, batch: int) -> list[str]:
    from skl2onnx import to_onnx

    paths = []
    for name, (est, data) in estimators().items():
        final = est.steps[-1][1] if hasattr(est, "steps") else est
        options = {id(final): {"zipmap": False}} if hasattr(final, "predict_proba") else None
        onx = to_onnx(est, data[:1], options=options)
        path = folder / f"{name}.onnx"
        path.write_bytes(onx.SerializeToString())
        np.savez(str(path) + ".feeds.npz", **{onx.graph.input[0].name: data[:batch]})
        paths.append(str(path))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", type=Path, help="another glassrt checkout to measure beside this one")
    ap.add_argument("--keep", type=Path, help="write the models here (default: a temporary folder)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (scikit-learn's convergence and skl2onnx's notes)
            paths = write_models(folder, a.batch)
        loop_args = [*paths, "--rounds", str(a.rounds), "--threads", str(a.threads)]
        if a.baseline:
            loop_args += ["--baseline", str(a.baseline)]
        return warm_loop.main(loop_args)


if __name__ == "__main__":
    sys.exit(main())
