"""What every benchmark script does the same way: link rates in tc's units, and the one-line
error for bad input or a machine that cannot.
"""
import argparse
import re
import sys

RATE_UNITS = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9}  # tc's, decimal


def parse_rate(text):
    """A rate in tc's units (20mbit, 1gbit, 500kbit) -> bits per second; unlimited -> None."""
    if text.strip().lower() == "unlimited":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?bit)", text.strip().lower())
    if not match or float(match.group(1)) * RATE_UNITS[match.group(2)] < 1000:
        raise argparse.ArgumentTypeError(
            "%r is not a rate: use for example 20mbit, 1gbit, 500kbit (at least 1kbit) or "
            "unlimited" % text)
    return int(float(match.group(1)) * RATE_UNITS[match.group(2)])


def format_rate(bits_per_sec):
    if bits_per_sec is None:
        return "unlimited"
    for unit, size in (("Gbit/s", 10 ** 9), ("Mbit/s", 10 ** 6), ("kbit/s", 10 ** 3)):
        if bits_per_sec >= size:
            return "%g %s" % (bits_per_sec / size, unit)
    return "%d bit/s" % bits_per_sec


def error(message):
    """Bad input, or something this machine lacks or refuses: one `error:` line on stderr;
    returns the exit status, 2."""
    print("error: " + message, file=sys.stderr, flush=True)
    return 2
