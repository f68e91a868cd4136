"""Placeholder: fixtures of this topology arrive with issue 12."""
