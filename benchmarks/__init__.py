"""Measurements and the command line; sits on top of every layer, imported by none."""
