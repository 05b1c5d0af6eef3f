"""NonMaxSuppression: greedy per (batch, class). The number of boxes kept depends on the data,
so the output is allocated per run."""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import FLOATS


@kernel("NonMaxSuppression", dtypes=FLOATS, versions=(10, None))
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None,
                        *, center_point_box=0):
    """Greedy NMS per (batch, class): keep the best box, drop the rest that overlap it too much, repeat."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
            or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"expected boxes (N, B, 4) and scores (N, C, B), got {list(boxes.shape)} and "
                         f"{list(scores.shape)}")
    limit = 0 if max_output_boxes_per_class is None or max_output_boxes_per_class.size == 0 \
        else max(int(max_output_boxes_per_class.reshape(-1)[0]), 0)
    iou_thr = 0.0 if iou_threshold is None or iou_threshold.size == 0 else iou_threshold.reshape(-1)[0]
    if not 0 <= iou_thr <= 1:  # (NaN too)
        raise ValueError(f"iou_threshold {iou_thr} is outside [0, 1]")
    if center_point_box not in (0, 1):
        raise ValueError(f"center_point_box {center_point_box} is neither 0 (corners) nor 1 (centers)")
    score_thr = None if score_threshold is None or score_threshold.size == 0 else score_threshold.reshape(-1)[0]
    selected = []
    if limit == 0:
        return np.zeros((0, 3), np.int64)
    for bi in range(boxes.shape[0]):
        bx = boxes[bi]
        if center_point_box:
            half_w, half_h = bx[:, 2] / 2, bx[:, 3] / 2
            x_min, x_max = bx[:, 0] - half_w, bx[:, 0] + half_w
            y_min, y_max = bx[:, 1] - half_h, bx[:, 1] + half_h
        else:  # corners in either order
            y_min, y_max = np.minimum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 0], bx[:, 2])
            x_min, x_max = np.minimum(bx[:, 1], bx[:, 3]), np.maximum(bx[:, 1], bx[:, 3])
        area = (x_max - x_min) * (y_max - y_min)
        for ci in range(scores.shape[1]):
            sc = scores[bi, ci]
            cand = np.arange(sc.shape[0]) if score_thr is None else np.flatnonzero(sc > score_thr)
            order = cand[np.argsort(-sc[cand], kind="stable")]  # best first, lower index on ties
            kept = 0
            while order.size and kept < limit:
                i, rest = order[0], order[1:]
                selected.append((bi, ci, i))
                kept += 1
                iw = np.minimum(x_max[i], x_max[rest]) - np.maximum(x_min[i], x_min[rest])
                ih = np.minimum(y_max[i], y_max[rest]) - np.maximum(y_min[i], y_min[rest])
                inter = iw * ih
                union = area[i] + area[rest] - inter
                with np.errstate(divide="ignore", invalid="ignore"):
                    suppress = (iw > 0) & (ih > 0) & (inter > 0) & (area[i] > 0) & (area[rest] > 0) & (union > 0) \
                        & (inter / union > iou_thr)
                order = rest[~suppress]
    return np.array(selected, np.int64).reshape(-1, 3)
