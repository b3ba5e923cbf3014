"""Polar-factor methods and their registry (:mod:`.registry`)."""

from .registry import POLAR_METHODS, PolarMethod, get_polar_method, polar_method_names

__all__ = ["POLAR_METHODS", "PolarMethod", "get_polar_method", "polar_method_names"]
