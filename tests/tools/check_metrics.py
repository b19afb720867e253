#!/usr/bin/env python3
"""Parses a /metrics answer with the Prometheus project's Python client, strictly, and prints
what it read as JSON, for tests/tests/metrics.rs to check.

    check_metrics.py openmetrics|prometheus FILE

`openmetrics` uses the client's OpenMetrics parser (it refuses a text that breaks the
OpenMetrics 1.0 grammar: no `# EOF`, a counter sample without `_total`, a histogram without
`+Inf` or `_count`, ...); `prometheus` its parser of Prometheus' text format 0.0.4. Prints
{"families": {name: {"type": ..., "unit": ..., "samples": [[name, labels, value], ...]}}},
or exits 1 with the parser's error.
"""
import json
import sys

from prometheus_client import parser as prometheus_parser
from prometheus_client.openmetrics import parser as openmetrics_parser


def main():
    fmt, path = sys.argv[1], sys.argv[2]
    text = open(path, encoding="utf-8").read()
    parse = {
        "openmetrics": openmetrics_parser.text_string_to_metric_families,
        "prometheus": prometheus_parser.text_string_to_metric_families,
    }[fmt]
    families = {}
    try:
        for family in parse(text):
            if family.name in families:
                raise ValueError(f"family {family.name} twice")
            families[family.name] = {
                "type": family.type,
                "unit": family.unit,
                "samples": [[s.name, s.labels, s.value] for s in family.samples],
            }
    except Exception as e:  # the parsers raise ValueError, and others on odd input
        sys.exit(f"{path}: not valid {fmt} text: {type(e).__name__}: {e}")
    json.dump({"families": families}, sys.stdout)


if __name__ == "__main__":
    main()
