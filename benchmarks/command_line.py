"""What the benchmarks' command lines share: link rates in tc's units (--bandwidth 20mbit,1gbit),
read and spelled back for people, and the one-line error for bad input or a machine that cannot.
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


def link_rate(label):
    """A --bandwidth rate as cluster.py takes it (20mbit, 1gbit, unlimited) -> bits per second,
    None for unlimited; ValueError with cluster.py's explanation otherwise."""
    try:
        return parse_rate(label)
    except argparse.ArgumentTypeError as e:
        raise ValueError("--bandwidth: %s" % e)


def parse_rates(text):
    """'unlimited,1gbit,20mbit' -> [(label, bits per second or None)], fastest first, each rate
    once; a bad rate raises ValueError with cluster.py's explanation."""
    rates = {}
    for label in (t.strip().lower() for t in text.split(",")):
        if not label:
            continue
        rates.setdefault(link_rate(label), label)
    if not rates:
        raise ValueError("--bandwidth: give at least one rate, e.g. unlimited,20mbit")
    fastest_first = sorted(rates, key=lambda bits: float("-inf") if bits is None else -bits)
    return [(rates[bits], bits) for bits in fastest_first]


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
