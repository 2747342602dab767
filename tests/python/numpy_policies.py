"""NumPy implementations of the scoring math of `snapkv`, `rkv` and `beacon`.

They follow core/ step by step (same reductions, pooling, tie rule, FPS and RoPE layout) and
serve two purposes: an independent reference the Python tests compare keep-sets with, and the
baseline that bench/numpy_policy_bench.py times against the C++ policies. RoPE and softmax are
the NumPy reference model's (beaconkv.reference): one of each.
Keys are in position order here (slot order == position order).
"""

import numpy as np

from beaconkv.reference import rope as rope_positions
from beaconkv.reference import softmax


def attention_scores(keys, queries, gqa="max_probs", reduce="max"):
    """keys [..., n, d]; queries [..., m, g, d] -> scores [..., n].

    gqa: "max_logits" (max over the group, then softmax), "max_probs" or "mean_probs"
    (softmax per query head, then max/mean). reduce: "max", "mean" or "sum" over the m
    observation queries (after the GQA reduction).
    """
    *batch, m, g, d = queries.shape
    n = keys.shape[-2]
    q = queries.reshape(*batch, m * g, d)
    logits = np.matmul(q, np.swapaxes(keys, -1, -2)) * np.float32(1.0 / np.sqrt(d))
    logits = logits.reshape(*batch, m, g, n)
    if gqa == "max_logits":
        probs = softmax(logits.max(axis=-2))
    else:
        p = softmax(logits)
        probs = p.max(axis=-2) if gqa == "max_probs" else p.mean(axis=-2)
    if reduce == "max":
        return probs.max(axis=-2)
    if reduce == "mean":
        return probs.mean(axis=-2)
    return probs.sum(axis=-2)


def pool1d(x, kind, kernel):
    """PyTorch max_pool1d / avg_pool1d (stride 1, padding kernel // 2) over the last axis."""
    if kind == "none" or kernel <= 1:
        return x
    half = kernel // 2
    pad = [(0, 0)] * (x.ndim - 1) + [(half, half)]
    fill = -np.inf if kind == "max" else 0.0
    padded = np.pad(x, pad, constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=-1)
    if kind == "max":
        return windows.max(axis=-1)
    return windows.sum(axis=-1) / np.float32(kernel)


def redundancy(keys, threshold=0.5):
    """R-KV redundancy of keys [n, d] (position order) -> [n]."""
    n = keys.shape[0]
    unit = keys / (np.linalg.norm(keys, axis=-1, keepdims=True) + np.float32(1e-8))
    s = unit @ unit.T
    np.fill_diagonal(s, 0.0)
    mask = s > threshold
    has = mask.any(axis=1)
    last = n - 1 - np.argmax(mask[:, ::-1], axis=1)
    rows = np.flatnonzero(has)
    s[rows, last[rows]] = 0.0
    return softmax(s.mean(axis=0))


def select(scores, protect, budget):
    """Protected indexes + best unprotected by (score desc, index desc) up to budget."""
    cand = np.flatnonzero(~protect)
    k = max(0, min(budget - int(protect.sum()), cand.size))
    order = np.lexsort((-cand, -scores[cand]))[:k]
    return np.sort(np.concatenate([np.flatnonzero(protect), cand[order]]))


def window_scores(keys, window_queries, window, pool_kernel, pooling="max"):
    """snapkv importance: [n - window] scores of the non-window keys."""
    region = keys.shape[-2] - window
    s = attention_scores(keys[..., :region, :], window_queries, "max_logits", "mean")
    return pool1d(s, pooling, pool_kernel)


def snapkv_keep(keys, window_queries, budget, window=8, pool_kernel=7, pooling="max"):
    n = keys.shape[0]
    if n <= budget:
        return np.arange(n)
    scores = np.zeros(n, np.float32)
    scores[: n - window] = window_scores(keys, window_queries, window, pool_kernel, pooling)
    protect = np.zeros(n, bool)
    protect[n - window:] = True
    return select(scores, protect, budget)


def rkv_keep(keys, window_queries, budget, window=8, pool_kernel=7, lam=0.1, threshold=0.5):
    n = keys.shape[0]
    if n <= budget:
        return np.arange(n)
    region = n - window
    importance = window_scores(keys, window_queries, window, pool_kernel, "max")
    red = redundancy(keys, threshold)[:region]
    scores = np.zeros(n, np.float32)
    scores[:region] = np.float32(lam) * importance - np.float32(1 - lam) * red
    protect = np.zeros(n, bool)
    protect[region:] = True
    return select(scores, protect, budget)


def rope(x, position, theta):
    """RoPE of every row of x [n, d] at one position."""
    return rope_positions(x, np.full(x.shape[-2], position), theta)


def fps_cosine(points, count, stop_below=0.0):
    """First `count` indexes of cosine farthest-point sampling (ties -> earliest); with
    stop_below > 0 it ends before the first point whose distance (1 - cos) to the chosen
    ones is below that."""
    norms = np.linalg.norm(points.astype(np.float64), axis=-1, keepdims=True)
    unit = np.where(norms > 0, points / np.where(norms > 0, norms, 1), 0).astype(np.float32)
    mean = unit.sum(axis=0)
    mn = np.linalg.norm(mean.astype(np.float64))
    mean_dir = (mean / mn if mn > 0 else mean).astype(np.float32)
    order = [int(np.argmax(np.float32(1) - unit @ mean_dir))]
    min_dist = np.float32(1) - unit @ unit[order[0]]
    chosen = np.zeros(points.shape[0], bool)
    chosen[order[0]] = True
    while len(order) < count:
        d = np.where(chosen, -np.inf, min_dist)
        nxt = int(np.argmax(d))
        if stop_below > 0 and d[nxt] < stop_below:
            break
        order.append(nxt)
        chosen[nxt] = True
        min_dist = np.minimum(min_dist, np.float32(1) - unit @ unit[nxt])
    return np.array(order, dtype=np.int64)


class BeaconBuffer:
    """The per-head pre-RoPE query buffer: append; FPS to buffer_min at buffer_max and when
    beacons are drawn, survivors kept in FPS order; beacons are the first of them.
    draw_on_fill: a draw whose survivors still number n_beacons is reused as it is, unless as
    many arrivals as since the last draw would fill the buffer. radius > 0: a draw stops at
    the first point within radius (1 - cos) of the chosen ones (a buffer of at most
    buffer_min is drawn too); a draw cut short is reused until a full draw's worth of queries
    (buffer_max - buffer_min) arrived or would arrive by the next one. bf16: each query is
    rounded to bfloat16 as it arrives (the core keeps the buffer in bfloat16 with score_bf16)."""

    def __init__(self, head_dim, buffer_min=256, buffer_max=512, draw_on_fill=True, radius=0.0,
                 bf16=False):
        self.buf = np.zeros((0, head_dim), np.float32)
        self.bf16 = bf16
        self.buffer_min, self.buffer_max = buffer_min, buffer_max
        self.draw_on_fill = draw_on_fill
        self.radius = radius
        self.arrivals = 0  # rows appended since the last beacons()
        self.reductions = 0
        self.ordered = 0  # leading rows in FPS order: the last reduction's survivors
        self.cut = False  # the last reduction stopped at the radius

    def append(self, q):
        for row in np.asarray(q, np.float32).reshape(-1, self.buf.shape[1]):
            row = round_bf16(row) if self.bf16 else row
            self.buf = np.vstack([self.buf, row[None]])
            self.arrivals += 1
            if self.buf.shape[0] == self.buffer_max:
                self.reduce()

    def reduce(self):
        size = self.buf.shape[0]
        if size > self.buffer_min or (self.radius > 0 and size > 0):
            count = min(self.buffer_min, size)
            order = fps_cosine(self.buf, count, self.radius)
            self.buf = self.buf[order]
            self.ordered, self.cut = len(order), len(order) < count
            self.reductions += 1

    def beacons(self, n_beacons, position, theta):
        size = self.buf.shape[0]
        due = (not self.draw_on_fill
               or (self.ordered < min(n_beacons, size) and not self.cut)
               or size + self.arrivals >= self.buffer_max
               or (self.radius > 0
                   and size - self.ordered + self.arrivals >= self.buffer_max - self.buffer_min))
        self.arrivals = 0
        if due:
            self.reduce()
        n = min(n_beacons, self.ordered if self.radius > 0 else self.buf.shape[0])
        if self.ordered >= n or n == self.buf.shape[0]:
            return rope(self.buf[:n], position, theta)
        return rope(self.buf[fps_cosine(self.buf, n)], position, theta)


def blurred_rows(beacons, blur_pairs, count):
    """The blurred rows of the first `count` beacons (rotated or not): copies with the RoPE
    pairs (i, i + d / 2), i < blur_pairs, zeroed (pair i turns faster the smaller i)."""
    rows = np.array(beacons[:count], dtype=np.float32, copy=True)
    half = rows.shape[1] // 2
    rows[:, :blur_pairs] = 0.0
    rows[:, half:half + blur_pairs] = 0.0
    return rows


def round_bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), as float32: NaN stays NaN,
    infinities stay, denormals become zeros of their sign (core RoundToBf16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exp = u & np.uint32(0x7F800000)
    nan = (exp == np.uint32(0x7F800000)) & ((u & np.uint32(0x007FFFFF)) != 0)
    ok = ~nan  # (a negative NaN would wrap the addition below)
    up = np.where(ok, u, 0) + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    r = up & np.uint32(0xFFFF0000)
    r = np.where(exp == 0, u & np.uint32(0x80000000), r)
    r = np.where(nan, (u | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), r)
    return r.astype(np.uint32).view(np.float32)


def beacon_scores(keys, recent_queries, beacons, pool_kernel=1):
    """max over recent queries (all group heads) and beacons of softmax attention."""
    d = keys.shape[-1]
    rows = np.concatenate([recent_queries.reshape(-1, d), beacons.reshape(-1, d)])
    s = attention_scores(keys, rows[:, None, :], "max_probs", "max")
    return pool1d(s, "max", pool_kernel)


def coverage_sample(positions, protect, k):
    """One unprotected index per non-empty stratum of k equal stretches of [lo, hi] (the first
    and last unprotected positions): the first one in each; all of them if there are <= k."""
    free = np.nonzero(~protect)[0]
    if k <= 0:
        return free[:0]
    if len(free) <= k:
        return free
    lo, hi = int(positions[free[0]]), int(positions[free[-1]])
    strata = (positions[free].astype(np.int64) - lo) * k // (hi - lo + 1)
    first = np.concatenate([[True], strata[1:] != strata[:-1]])
    return free[first]


def beacon_keep(keys, recent_queries, beacons, budget, prompt_len=0, n_recent=48,
                n_sinks=4, protect_prompt=False, pool_kernel=1, coverage=False, prompt_slots=4,
                positions=None):
    """coverage: the head is in one of the first `coverage_layers` layers (evenly spaced
    sample kept first, the rest by score); otherwise the best-scored unprotected prompt tokens
    (positions < prompt_len; keys in position order, positions default 0..n-1) are kept first:
    prompt_slots of them, at most (budget - n_recent - n_sinks) // 8."""
    n = keys.shape[0]
    if n <= budget:
        return np.arange(n)
    scores = beacon_scores(keys, recent_queries, beacons, pool_kernel)
    protect = np.zeros(n, bool)
    prompt = min(prompt_len, n)
    head = prompt if protect_prompt and prompt + n_recent <= budget else min(n_sinks, n)
    protect[:head] = True
    protect[max(n - n_recent, 0):] = True
    if coverage:
        sample = coverage_sample(np.arange(n), protect, budget - int(protect.sum()))
        scores = scores.copy()
        scores[sample] += np.float32(2)
    else:
        slots = max(0, min(prompt_slots, (budget - n_recent - n_sinks) // 8))
        pos = np.arange(n) if positions is None else np.asarray(positions)
        region = [i for i in range(n) if pos[i] < prompt_len and not protect[i]]
        # Best score first, ties to the newer token, as in select.
        region.sort(key=lambda i: (-float(scores[i]), -i))
        protect[region[:slots]] = True
    return select(scores, protect, budget)
