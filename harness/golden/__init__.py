"""Goldens, every kind in one place: the format (typed, validated on load), the store (root, names
from the pins, lookup, atomic writes), judging records against them, refresh from fresh records, the
label manifests, the seed studies transcribed from the skill card, and the CPU-probe and estimate
goldens."""
