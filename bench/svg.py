"""Tiny SVG plots for the benchmark report (standard library only)."""

import math
from xml.sax.saxutils import escape

W, H = 720, 400
ML, MR, MT, MB = 70, 160, 40, 55
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def _frame(title, xlabel, ylabel):
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
            f'<rect width="{W}" height="{H}" fill="white"/>',
            f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
            f'<text x="{ML + (W - ML - MR) / 2}" y="{H - 12}" text-anchor="middle">{escape(xlabel)}</text>',
            f'<text x="16" y="{MT + (H - MT - MB) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 16 {MT + (H - MT - MB) / 2})">{escape(ylabel)}</text>']


def _nice(hi):
    if hi <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(hi))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= hi:
            return m * e
    return 10 * e


def histogram(path, values, title, xlabel, ylabel, markers=()):
    """Histogram of `values`, with vertical marker lines at (x, label)."""
    values = sorted(values)
    hi = _nice(max(values[int(0.995 * (len(values) - 1))] if values else 1, max((m[0] for m in markers), default=0)) * 1.05)
    bins = 40
    width = hi / bins
    counts = [0] * bins
    over = 0
    for v in values:
        i = int(v / width)
        if i >= bins:
            over += 1
        else:
            counts[max(i, 0)] += 1
    ymax = _nice(max(counts) if counts else 1)
    pw, ph = W - ML - MR, H - MT - MB
    out = _frame(title, xlabel, ylabel)
    out.append(f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" stroke="black"/>')
    out.append(f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" stroke="black"/>')
    for t in range(6):
        x = ML + pw * t / 5
        out.append(f'<text x="{x}" y="{MT + ph + 16}" text-anchor="middle">{hi * t / 5:g}</text>')
        y = MT + ph - ph * t / 5
        out.append(f'<text x="{ML - 6}" y="{y + 4}" text-anchor="end">{ymax * t / 5:g}</text>')
        out.append(f'<line x1="{ML}" y1="{y}" x2="{ML + pw}" y2="{y}" stroke="#eee"/>')
    for i, c in enumerate(counts):
        if c:
            h = ph * c / ymax
            out.append(f'<rect x="{ML + pw * i / bins + 1:.1f}" y="{MT + ph - h:.1f}" width="{pw / bins - 2:.1f}" '
                       f'height="{h:.1f}" fill="{COLOURS[0]}"/>')
    for k, (x, label) in enumerate(markers):
        px = ML + pw * x / hi
        out.append(f'<line x1="{px:.1f}" y1="{MT}" x2="{px:.1f}" y2="{MT + ph}" stroke="{COLOURS[1]}" stroke-dasharray="5,4"/>')
        out.append(f'<text x="{px + 4:.1f}" y="{MT + 14 + 14 * k}" fill="{COLOURS[1]}">{escape(label)}</text>')
    n = len(values)
    if n:
        stats = [f"n = {n}", f"p50 = {values[n // 2]:.3f}", f"p90 = {values[int(0.9 * (n - 1))]:.3f}",
                 f"p99 = {values[round(0.99 * (n - 1))]:.3f}"]
        if over:
            stats.append(f"{over} beyond the axis")
        for k, s in enumerate(stats):
            out.append(f'<text x="{W - MR + 12}" y="{MT + 16 + 16 * k}">{escape(s)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def scaling(path, xs, series, title, xlabel):
    """Log-log lines: one series per (label, ys) over the same xs."""
    allv = [v for _, ys in series for v in ys if v > 0]
    lo = 10 ** math.floor(math.log10(min(allv))) if allv else 0.1
    hi = 10 ** math.ceil(math.log10(max(allv))) if allv else 10
    xlo, xhi = 10 ** math.floor(math.log10(min(xs))), 10 ** math.ceil(math.log10(max(xs)))
    if xhi == xlo:
        xhi = xlo * 10
    if hi == lo:
        hi = lo * 10
    pw, ph = W - ML - MR, H - MT - MB

    def px(x):
        return ML + pw * (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo))

    def py(y):
        return MT + ph - ph * (math.log10(max(y, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    out = _frame(title, xlabel, "value (log scale)")
    out.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    d = int(round(math.log10(hi / lo)))
    for k in range(d + 1):
        y = lo * 10 ** k
        out.append(f'<line x1="{ML}" y1="{py(y):.1f}" x2="{ML + pw}" y2="{py(y):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{ML - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    x = xlo
    while x <= xhi * 1.0001:
        out.append(f'<text x="{px(x):.1f}" y="{MT + ph + 16}" text-anchor="middle">{x:,.0f}</text>')
        x *= 10
    for k, (label, ys) in enumerate(series):
        c = COLOURS[k % len(COLOURS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in zip(xs, ys):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{c}"/>')
            out.append(f'<text x="{px(x) + 5:.1f}" y="{py(y) - 6:.1f}" fill="{c}" font-size="10">{y:.3g}</text>')
        out.append(f'<text x="{W - MR + 12}" y="{MT + 16 + 18 * k}" fill="{c}">{escape(label)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
