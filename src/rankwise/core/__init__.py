"""Machinery shared by several methods, and nothing method-specific."""
