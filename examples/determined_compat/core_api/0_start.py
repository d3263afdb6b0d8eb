#!/usr/bin/env python3
"""Step 0: an ordinary script, run by the platform. Nothing to report yet."""

import logging

import determined as det

logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)

total = 0
for step in range(1, 51):
    total += step
logging.info(f"counted to {step}: total {total}")
