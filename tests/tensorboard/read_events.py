#!/opt/gradaccum/venv/bin/python
"""Reads a TensorBoard log directory with TensorBoard's own reader (EventAccumulator, which checks
every record's CRC32C and stops at the first bad one) and writes what it found as JSON:

  {"scalars": {tag: [[step, value], ...]},
   "histograms": {tag: [[step, min, max, num, sum, sum_squares, [bucket_limit...], [bucket...]], ...]}}

  read_events.py LOGDIR OUT.json
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import (HISTOGRAMS, SCALARS,
                                                                    EventAccumulator)


def main():
    logdir, out = sys.argv[1], sys.argv[2]
    events = EventAccumulator(logdir, size_guidance={SCALARS: 0, HISTOGRAMS: 0})
    events.Reload()
    tags = events.Tags()
    found = {
        "scalars": {tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in tags["scalars"]},
        "histograms": {
            tag: [[e.step, h.min, h.max, h.num, h.sum, h.sum_squares, list(h.bucket_limit), list(h.bucket)]
                  for e in events.Histograms(tag) for h in [e.histogram_value]]
            for tag in tags["histograms"]
        },
    }
    with open(out, "w") as f:
        json.dump(finite(found), f, allow_nan=False)


def finite(x):
    """x with every NaN or infinity replaced by None (JSON null)."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


if __name__ == "__main__":
    main()
